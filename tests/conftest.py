"""Shared fixtures: tiny random Llama targets built locally, and the committed trained target.

Everything runs offline on CPU. The random targets reuse the committed tokenizer (with its
ChatML template) so chat rendering is real; their weights are random and seeded.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80, which rich reads once, when eagle3cli's console is
    # made: the width would be fixed and `wide_console` could not widen it (a message holding a long
    # tmp path then wraps). Leave the width to each test, as in one process (`make test` runs -n 2).
    os.environ.pop("COLUMNS", None)

REPO = Path(__file__).resolve().parents[1]
TINY_TARGET = REPO / "models" / "tiny-target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if item.get_closest_marker("gpu"):  # the marker: `"gpu" in item.keywords` also matched test names
                item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models are per-op-overhead bound, and two OpenMP threads on a shared 2-core machine
    contend badly (20x slower measured): tests run single-threaded, as `make test` also sets."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def build_random_target(
    out: Path, num_layers: int = 4, hidden: int = 64, seed: int = 0, heads: int = 4, kv_heads: int = 2
) -> Path:
    """A random LlamaForCausalLM saved like a real checkpoint (config, safetensors, tokenizer)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(TINY_TARGET))
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in TOKENIZER_FILES:
        if (TINY_TARGET / f).exists():
            shutil.copy(TINY_TARGET / f, out / f)
    return out


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """4-layer, 64-wide random target (aux layers [1, 2, 2] by the default rule, in layer order)."""
    return build_random_target(tmp_path_factory.mktemp("tiny-random-target") / "model", num_layers=4)


@pytest.fixture(scope="session")
def deep_target_dir(tmp_path_factory) -> Path:
    """8-layer random target whose default aux layers [2, 4, 5] are distinct."""
    return build_random_target(tmp_path_factory.mktemp("deep-random-target") / "model", num_layers=8, seed=1)


@pytest.fixture(scope="session")
def trained_target_dir() -> Path:
    """The committed small trained target (models/tiny-target) for quality checks."""
    assert (TINY_TARGET / "model.safetensors").exists(), "models/tiny-target is missing: run `make tiny-target`"
    return TINY_TARGET


@pytest.fixture(scope="session")
def bundled_data() -> Path:
    """The small datasets shipped inside the package (eagle3cli/bundled)."""
    from eagle3cli.readers.sources import bundled

    return bundled("README.md").parent


@pytest.fixture(scope="module")
def tiny_model_tok(tiny_target_dir):
    from eagle3cli.model.target import load_target

    model, tok, _ = load_target(tiny_target_dir)
    return model, tok


@pytest.fixture
def model_server(tiny_model_tok):
    """A factory of real OpenAI-compatible servers over the tiny target (127.0.0.1, a free port),
    each with the faults it is given (`fail_first=`, `bad_first=`, ...); all stopped after the test."""
    from eagle3cli.data.http_server import ModelServer

    servers = []

    def make(**faults) -> ModelServer:
        srv = ModelServer(*tiny_model_tok, served_model_name="tiny", **faults)
        srv.start("127.0.0.1", 0)
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.stop()


class Captured(Exception):
    """Raised instead of running a stage: carries the config the command line built."""


@pytest.fixture
def parse(monkeypatch):
    """`parse(argv)` -> the config `eagle3 *argv` would run with (nothing runs)."""
    from eagle3cli import options
    from eagle3cli.cli import main
    from eagle3cli.config import build_config

    def capture(cls, recipe, section, **given):
        raise Captured(build_config(cls, recipe, section, **given))

    monkeypatch.setattr(options, "build_config", capture)

    def run(argv: list[str]):
        with pytest.raises(Captured) as got:
            main(argv)
        return got.value.args[0]

    return run
