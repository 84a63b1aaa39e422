"""Heads for tests: a random head saved for a target, and a draft started from a target's weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from eagle3cli.head.read import init_draft_from_weights
from eagle3cli.head.write import save_head
from eagle3cli.model.target import load_target, target_identity
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.vocab import t2d_of


def make_head(
    target_dir: Path,
    out: Path,
    seed: int = 0,
    aux=None,
    norm_before_fc: bool = False,
    norm_before_residual: bool = False,
) -> Path:
    """A random head (512-token draft vocab) for the target in `target_dir`, saved at `out`; with
    EAGLE-3.1's norms when asked (input_norm's weights then random too, so a mix-up shows)."""
    model, tok, path = load_target(target_dir)
    aux = aux or default_aux_layer_ids(model.config.num_hidden_layers)
    cfg = draft_config_from_target(model.config, 512, aux, norm_before_fc, norm_before_residual)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    if draft.input_norm is not None:
        with torch.no_grad():
            draft.input_norm.weight.uniform_(0.5, 1.5)
    d2t = torch.arange(512)  # draft id i -> target id 2i
    draft.set_vocab_maps(d2t, t2d_of(d2t, model.config.vocab_size))
    return save_head(draft, out, target_identity(path, tok, model.config).as_dict())


def init_draft_from_target(
    draft: Eagle3Draft, target_model, d2t: torch.Tensor, t2d: torch.Tensor | None = None
) -> None:
    """`init_draft_from_weights` with the tensors of a loaded target model (its final norm's
    effective scale measured, so any norm convention is right)."""
    has_norm = getattr(getattr(target_model, "model", None), "norm", None) is not None
    init_draft_from_weights(
        draft,
        target_model.get_input_embeddings().weight,
        target_model.get_output_embeddings().weight,
        final_norm_scale(target_model) if has_norm else None,
        d2t,
        t2d,
    )


@torch.no_grad()
def final_norm_scale(model) -> torch.Tensor:
    """The effective per-channel scale of the loaded target's final norm, measured: on a constant
    vector of RMS 1e3 (eps is then negligible) an RMSNorm returns exactly its scale."""
    import copy

    norm = copy.deepcopy(model.model.norm).float().cpu()
    return norm(torch.full((1, norm.weight.shape[0]), 1e3))[0]


# ---------------------------------------------------------------- crafted heads
def _cfg(head: Path, drop: tuple[str, ...] = (), **changes) -> None:
    cfg = json.loads((head / "config.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    (head / "config.json").write_text(json.dumps({**cfg, **changes}))


def _tensors(head: Path, drop: tuple[str, ...] = (), **replace) -> None:
    from safetensors.torch import load_file, save_file

    t = load_file(str(head / "model.safetensors"))
    for k in drop:
        t.pop(k)
    save_file({**t, **{k.replace("__", "."): v for k, v in replace.items()}}, str(head / "model.safetensors"))


def _recorded(head: Path, **changes) -> None:
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle3"]["target"] |= changes
    _cfg(head, eagle3=cfg["eagle3"])


def _d2t(head: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(head / "model.safetensors"))["d2t"].clone()


def _two_on_one(head: Path) -> None:
    d2t = _d2t(head)
    d2t[1] = d2t[0] - 1
    _tensors(head, d2t=d2t)


def _foreign(head: Path, sglang: bool) -> None:
    """The head as another tool writes it: SGLang's ids only (SpecForge), or vLLM's top-level ids only."""
    cfg = json.loads((head / "config.json").read_text())
    cfg.pop("eagle3")
    cfg.pop("eagle_aux_hidden_state_layer_ids" if sglang else "eagle_config")
    (head / "config.json").write_text(json.dumps(cfg))


def _nan(head: Path) -> None:
    from safetensors.torch import load_file

    w = load_file(str(head / "model.safetensors"))["midlayer.mlp.up_proj.weight"].clone()
    w[0, 0] = float("nan")
    _tensors(head, midlayer__mlp__up_proj__weight=w)


# name -> the edit of a good head from `make_head` on models/tiny-target (12 layers, aux [2, 6, 9]): the
# reproductions of issue 61, the serve preflight's and the head contract's cases, the reliability
# rounds' (NaN weights, renamed tensors)
CRAFTED: dict[str, Callable[[Path], object] | None] = {
    "good": lambda h: None,
    "another-vocab": lambda h: _recorded(h, vocab_hash="0" * 16),
    "another-template": lambda h: _recorded(h, chat_template_hash="0" * 16),
    "another-weights": lambda h: _recorded(h, fingerprint="0" * 16),
    "other-layer-count": lambda h: _recorded(h, num_hidden_layers=24),
    "norm-output": lambda h: _cfg(h, norm_output=True),
    "short-max-positions": lambda h: _cfg(h, max_position_embeddings=64),
    "tied-embeddings": lambda h: _cfg(h, tie_word_embeddings=True),
    "no-draft-vocab-size": lambda h: _cfg(h, drop=("draft_vocab_size",)),
    "null-draft-vocab-size": lambda h: _cfg(h, draft_vocab_size=None),
    "two-layers": lambda h: _cfg(h, num_hidden_layers=2),
    "attention-bias": lambda h: _cfg(h, attention_bias=True),
    "wrong-architecture": lambda h: _cfg(h, architectures=["LlamaForCausalLM"]),
    "fc-norm": lambda h: _cfg(h, fc_norm=True),
    "no-aux-state": lambda h: _cfg(h, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 5, 8],
                                                    "use_aux_hidden_state": False}),
    "vocab-size-mismatch": lambda h: _cfg(h, vocab_size=999),
    "aux-id-0": lambda h: (_foreign(h, sglang=False), _cfg(h, eagle_aux_hidden_state_layer_ids=[0, 6, 9])),
    "aux-out-of-order": lambda h: _cfg(
        h, eagle3={**json.loads((h / "config.json").read_text())["eagle3"], "aux_layer_ids": [9, 2, 6]},
        eagle_aux_hidden_state_layer_ids=[9, 2, 6],
        eagle_config={"eagle_aux_hidden_state_layer_ids": [8, 1, 5], "use_aux_hidden_state": True}),
    "aux-contradiction": lambda h: _cfg(h, eagle_aux_hidden_state_layer_ids=[2, 6, 10]),
    "aux-past-the-target": lambda h: (_foreign(h, sglang=False), _cfg(h, eagle_aux_hidden_state_layer_ids=[2, 6, 12])),
    "two-aux-layers": None,  # built by make_head(aux=(2, 9)): llama.cpp reads exactly 3
    "sglang-layout": lambda h: _foreign(h, sglang=True),
    "vllm-layout": lambda h: _foreign(h, sglang=False),
    "no-d2t": lambda h: _tensors(h, drop=("d2t",)),
    "d2t-two-on-one": _two_on_one,
    "d2t-float": lambda h: _tensors(h, d2t=_d2t(h).to(torch.float32)),
    "t2d-disagrees": lambda h: _tensors(h, t2d=torch.zeros(4096, dtype=torch.bool)),
    "unknown-tensor": lambda h: _tensors(h, midlayer__hidden_layernorm__weight=torch.ones(128)),
    "missing-tensor": lambda h: _tensors(h, drop=("midlayer.mlp.up_proj.weight",)),
    "nan-weight": _nan,
    "norm-before-fc": None,  # built by make_head(norm_before_fc=True): SGLang 0.5.23 reads it
    "norm-before-residual": None,  # built by make_head(norm_before_residual=True): SGLang never reads it
}  # fmt: skip


def crafted_heads(target_dir: Path, out: Path) -> dict[str, Path]:
    """Every head of `CRAFTED`, each in its own folder under `out`."""
    import shutil

    good = make_head(target_dir, out / "_good")
    heads = {}
    for name, edit in CRAFTED.items():
        if edit is None:
            kind = {"two-aux-layers": {"aux": (2, 9)}, "norm-before-fc": {"norm_before_fc": True}}
            heads[name] = make_head(target_dir, out / name, **kind.get(name, {"norm_before_residual": True}))
            continue
        heads[name] = Path(shutil.copytree(good, out / name))
        edit(heads[name])
    return heads
