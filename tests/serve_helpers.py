"""Helpers for the serve tests (no tests here): a real head export (`save_head`) and surgical breakages."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3cli.head.check import Problem, problems
from eagle3cli.head.write import save_head
from eagle3cli.run_folder.manifest import model_fingerprint
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target


def check_head(head_dir: Path, target_dir: Path, engine: str = "sglang") -> list[Problem]:
    """What `eagle3 serve --engine ENGINE` finds in the head folder against the target (its preflight)."""
    return problems(Path(head_dir), Path(target_dir), engine)


def export_head(
    out: Path, target_dir: Path, draft_vocab: int = 256, aux: tuple[int, ...] | None = None, seed: int = 0
) -> Path:
    """A random head for `target_dir`, written by the real exporter."""
    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    aux = aux or default_aux_layer_ids(tcfg["num_hidden_layers"])
    torch.manual_seed(seed)
    draft = Eagle3Draft(draft_config_from_target(tcfg, draft_vocab, aux))
    vocab = tcfg["vocab_size"]
    target_ids = torch.randperm(vocab)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[target_ids] = True
    draft.set_vocab_maps(target_ids - torch.arange(draft_vocab), t2d)
    identity = {
        "path": str(target_dir),
        "fingerprint": model_fingerprint(target_dir),
        "vocab_size": vocab,
        "hidden_size": tcfg["hidden_size"],
        "num_hidden_layers": tcfg["num_hidden_layers"],
        "max_position_embeddings": tcfg["max_position_embeddings"],
    }
    return save_head(draft, out, target_identity=identity)


def copy_head(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(head: Path, drop: tuple[str, ...] = (), **changes) -> None:
    cfg = json.loads((head / "config.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(changes)
    (head / "config.json").write_text(json.dumps(cfg, indent=2))


def edit_tensors(
    head: Path, drop: tuple[str, ...] = (), rename: dict | None = None, replace: dict | None = None
) -> None:
    tensors = load_file(str(head / "model.safetensors"))
    for k in drop:
        tensors.pop(k)
    for old, new in (rename or {}).items():
        tensors[new] = tensors.pop(old)
    tensors.update(replace or {})
    save_file(tensors, str(head / "model.safetensors"))


# ---------------------------------------------------------------- the serve command line
CHAIN = ("--steps", "3", "--topk", "1", "--draft-tokens", "4")  # a 3-token chain: what vLLM drafts


def serve_args(target: Path, head: Path, *flags: str) -> list[str]:
    """`eagle3 serve --target T --head H FLAGS...`, as `main` takes it."""
    return ["serve", "--target", str(target), "--head", str(head), *flags]


def printed_command(out: str) -> list[str]:
    """The engine command `serve --dry-run` printed (one `--flag value` a line, `\\` continued)."""
    return shlex.split(out.replace("\\\n", " "))


def skip_without_sglang_parser() -> None:
    """SGLang's own parser imports here (`make sglang-cpu`), or the test skips and says why."""
    from eagle3cli.serve.commands import sglang_parser_unavailable_reason

    reason = sglang_parser_unavailable_reason()
    if reason is not None:
        pytest.skip(f"sglang's parser does not import here ({reason}); install it with `make sglang-cpu`")


def assert_sglang_parses(argv: list[str]) -> None:
    """The command parses under SGLang's own parser, as serve meant it (skips where it does not import)."""
    from eagle3cli.serve.commands import validate_sglang_argv

    skip_without_sglang_parser()
    check = validate_sglang_argv(argv)
    assert check.ok, check.message
