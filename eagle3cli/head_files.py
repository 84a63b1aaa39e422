"""The exported head: `runs/NAME/head/` in the layout SGLang's and vLLM's `LlamaForCausalLMEagle3` load.

Files: `config.json` (a Llama config, see `head_config`), `model.safetensors` (the names below,
no `model.` prefix, no embeddings) and `manifest.json`. Heads of every layout are read by
`heads.read_head` (`load_head` here is its draft-building front).

Engine facts this layout relies on (SGLang `srt/models/llama_eagle3.py`, vLLM
`model_executor/models/llama_eagle3.py`):
  * SGLang maps a checkpoint name `n` to `n` if it is a parameter, else to `model.n`; unknown names
    are skipped silently, so a typo here is a head that loads with random weights.
  * `d2t` becomes SGLang's `hot_token_id = d2t + arange(draft_vocab)`; `t2d` is skipped by SGLang
    and vLLM, kept for our tools. A missing `d2t` maps draft id i to target id i (acceptance ~0).
  * `draft_vocab_size` must be present (SGLang fails without it; `null` means the target's lm_head).
  * `tie_word_embeddings: false`, else the trained `lm_head` is replaced by the embeddings.
  * Explicit aux layer ids: SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as "output of
    layer k" (captures the input of layer k+1); vLLM reads a top-level
    `eagle_aux_hidden_state_layer_ids` as `hidden_states[k]`. Ours are `hidden_states[k]`, so the
    head writes `k - 1` for SGLang and `k` for vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .errors import UsageError
from .folders import claim_output
from .manifest import (
    atomic_write_json,
    atomic_write_tensors,
    read_json,
    remove_dead_temps,
    shard_record,
    write_manifest,
)
from .model.heads import HEAD_ARCH, HEAD_TENSOR_NAMES, HEAD_WEIGHTS, HeadSpec, copy_embeddings, load_any_head
from .speculate.aux_layers import EXPECTED, aux_layer_problems, sglang_ids, vllm_ids
from .speculate.draft import Eagle3Draft

__all__ = ["HEAD_ARCH", "HEAD_TENSOR_NAMES", "HEAD_WEIGHTS", "export_head", "load_head", "save_head"]
# Keys of the draft's own config that are ours, not the engines' (moved into the `eagle3` block).
_OWN_KEYS = ("aux_layer_ids",)
EXPORT_FORMATS = ("sglang", "vllm", "speculators")
EXPORT_FILES = (HEAD_WEIGHTS, "config.json")  # what an export folder holds besides its manifest


def head_state_dict(draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    """The exported tensors: every draft parameter/buffer but the (frozen, target-owned) embeddings."""
    sd = draft.state_dict()
    missing = [n for n in HEAD_TENSOR_NAMES if n not in sd]
    if missing:
        raise UsageError(f"draft model lacks {missing}", "an eagle3cli.speculate.draft.Eagle3Draft")
    # Contiguous fp copies: safetensors refuses shared/non-contiguous storage.
    return {n: sd[n].detach().to("cpu").contiguous().clone() for n in HEAD_TENSOR_NAMES}


def head_config(draft: Eagle3Draft, target_identity: dict | None = None, extra: dict | None = None) -> dict:
    """config.json for SGLang/vLLM: a 1-layer Llama config plus the EAGLE-3 fields both engines read."""
    cfg = draft.config.to_dict()
    aux = [int(i) for i in draft.config.aux_layer_ids]
    problems = aux_layer_problems(aux)
    if problems:
        raise UsageError(problems[0], EXPECTED)
    for k in _OWN_KEYS + ("_name_or_path", "transformers_version", "id2label", "label2id", "dtype"):
        cfg.pop(k, None)
    max_pos = int(cfg.get("max_position_embeddings") or 0)
    if target_identity and target_identity.get("max_position_embeddings"):
        max_pos = max(max_pos, int(target_identity["max_position_embeddings"]))
    rope = cfg.get("rope_parameters") or {}
    cfg.update(
        architectures=[HEAD_ARCH],
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
        norm_output=False,
        draft_vocab_size=int(draft.config.draft_vocab_size),
        vocab_size=int(draft.config.vocab_size),
        target_hidden_size=int(draft.config.target_hidden_size),
        max_position_embeddings=max_pos,
        torch_dtype="bfloat16" if draft.fc.weight.dtype == torch.bfloat16 else "float32",
        # SGLang adds 1 to these (output of layer k -> input of layer k+1).
        eagle_config={"eagle_aux_hidden_state_layer_ids": sglang_ids(aux), "use_aux_hidden_state": True},
        # vLLM reads this first, as hidden_states[k].
        eagle_aux_hidden_state_layer_ids=vllm_ids(aux),
        eagle3={"aux_layer_ids": aux, "target": target_identity or {}, **(extra or {})},
    )
    # Engines that predate transformers 5's rope_parameters read these top-level names.
    if "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
    if rope.get("rope_type", "default") != "default":
        cfg.setdefault("rope_scaling", rope)
    return cfg


def save_head(
    draft: Eagle3Draft, out_dir: Path, target_identity: dict | None = None, extra: dict | None = None
) -> Path:
    """Write `out_dir/{config.json, model.safetensors, manifest.json}` (manifest last, atomically)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").unlink(missing_ok=True)  # an interrupted export is visibly unfinished
    archs = target_architectures(target_identity)
    if archs and "target_architectures" not in (extra or {}):
        # the engine tables (model.engines) decide by the target's class; later exports may lack the target
        extra = {"target_architectures": archs, **(extra or {})}
    tensors = head_state_dict(draft)
    atomic_write_tensors(out_dir / HEAD_WEIGHTS, tensors, {"format": "pt"})
    atomic_write_json(out_dir / "config.json", head_config(draft, target_identity, extra))
    write_manifest(
        out_dir,
        "head",
        target=target_identity or {},
        aux_layer_ids=[int(i) for i in draft.config.aux_layer_ids],
        draft_vocab_size=int(draft.config.draft_vocab_size),
        shards=[shard_record(out_dir / HEAD_WEIGHTS, tensors=len(tensors))],
        **(extra or {}),
    )
    return out_dir


def target_architectures(target_identity: dict | None) -> list[str] | None:
    """`architectures` of the target's config.json, when the target folder is on this machine."""
    path = Path((target_identity or {}).get("path") or "") / "config.json"
    if not (target_identity or {}).get("path") or not path.is_file():
        return None
    try:
        archs = read_json(path).get("architectures")
    except (json.JSONDecodeError, OSError):
        return None
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else None


def load_head(head_dir: Path, target_model=None, dtype: torch.dtype | None = None) -> Eagle3Draft:
    """The draft of a head folder of any layout (`heads.read_head`); with `target_model`, its
    input embeddings are copied in and its layer count gives the engines' default aux layers.

    Refuses a folder whose config or tensor names/shapes do not make a one-layer EAGLE-3 head
    (a head the engines would load half-random). Without a target the embeddings are left zero:
    set them before drafting (eval/serve pass the target).
    """
    return load_any_head(head_dir, target_model, dtype)[0]


@torch.no_grad()
def init_draft_from_weights(
    draft: Eagle3Draft,
    embed: torch.Tensor,
    lm_head: torch.Tensor | None,
    norm: torch.Tensor | None,
    d2t: torch.Tensor,
    t2d: torch.Tensor | None = None,
    norm_offset: float = 0.0,
) -> None:
    """Start from the target: frozen embeddings, lm_head = the target's rows of the draft vocab,
    final norm = the target's. fc/midlayer then only have to reproduce something like the target's
    last hidden state for step 0 to be right, which shortens early training a lot.

    `norm_offset`: Gemma-style norms scale by (1 + w) and store w; the draft's Llama RMSNorm
    scales by its weight, so it gets w + 1 (`model.target.final_norm_offset`)."""
    copy_embeddings(draft, embed)
    d2t = d2t.to(torch.long).cpu()
    if t2d is None:
        t2d = torch.zeros(draft.config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(len(d2t)) + d2t] = True
    draft.set_vocab_maps(d2t, t2d)
    target_ids = torch.arange(len(d2t)) + d2t
    if lm_head is not None and lm_head.shape[1] == draft.lm_head.weight.shape[1]:
        draft.lm_head.weight.copy_(lm_head[target_ids.to(lm_head.device)].to(draft.lm_head.weight))
    if norm is not None and norm.shape == draft.norm.weight.shape:
        draft.norm.weight.copy_(norm.to(draft.norm.weight) + norm_offset)


@torch.no_grad()
def self_check(draft: Eagle3Draft, head_dir: Path, seq_len: int = 16, seed: int = 0) -> float:
    """Reload the export and compare its logits with the in-memory draft's; returns max |diff|."""
    reloaded = load_head(head_dir)
    reloaded.embed_tokens.weight.copy_(draft.embed_tokens.weight.to("cpu", reloaded.embed_tokens.weight.dtype))
    ref = draft
    device = next(draft.parameters()).device
    g = torch.Generator().manual_seed(seed)
    cfg = draft.config
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len), generator=g)
    aux = torch.randn(1, seq_len, len(cfg.aux_layer_ids) * cfg.target_hidden_size, generator=g)
    was_training = ref.training
    ref.eval()
    try:
        h_ref = list(ref.ttt_unroll(ids.to(device), aux.to(device, ref.fc.weight.dtype), steps=2))[-1]
        h_new = list(reloaded.ttt_unroll(ids, aux.to(reloaded.fc.weight.dtype), steps=2))[-1]
        diff = (ref.logits(h_ref).float().cpu() - reloaded.logits(h_new).float()).abs().max().item()
    finally:
        ref.train(was_training)
    return diff


# ---------------------------------------------------------------- other layouts
def _speculators_config(cfg: dict, num_speculative_tokens: int) -> dict:
    """vLLM `speculators` style: the Llama layer config nested, speculator fields top-level."""
    layer = {
        k: v
        for k, v in cfg.items()
        if k
        not in (
            "eagle3",
            "eagle_config",
            "eagle_aux_hidden_state_layer_ids",
            "architectures",
            "draft_vocab_size",
            "target_hidden_size",
            "norm_output",
        )
    }
    layer["architectures"] = ["LlamaForCausalLM"]
    target = (cfg.get("eagle3") or {}).get("target") or {}
    verifier_archs = (cfg.get("eagle3") or {}).get("target_architectures") or ["LlamaForCausalLM"]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg["draft_vocab_size"],
        "target_hidden_size": cfg.get("target_hidden_size"),
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": cfg.get("eagle_aux_hidden_state_layer_ids"),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": num_speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {"name_or_path": target.get("path"), "architectures": verifier_archs},
        },
        "torch_dtype": cfg.get("torch_dtype", "float32"),
        "eagle3": cfg.get("eagle3"),
    }


def _own_layout_config(draft: Eagle3Draft, spec: HeadSpec) -> dict:
    """config.json in eagle3's layout for a head read from any layout; its target recorded as a
    reference that resolves from anywhere (absolute path or hub id)."""
    from .model.target import resolvable_reference

    target = dict(spec.target)
    ref = resolvable_reference(spec.target_ref, base=spec.path)
    if ref:
        target["path"] = ref
    target.pop("name_or_path", None)
    if spec.layout == "eagle3":
        cfg = read_json(spec.path / "config.json")
        cfg["eagle3"] = {**cfg.get("eagle3", {}), "target": target}
        return cfg
    return head_config(draft, target, {"converted_from": {"layout": spec.layout, "path": str(spec.path.resolve())}})


def speculators_support(head_cfg: dict):
    """vLLM's support for the head's target (speculators heads are vLLM's format)."""
    from .model.engines import target_support

    return target_support("vllm", (head_cfg.get("eagle3") or {}).get("target_architectures"))


EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def export_head(head_dir: Path, fmt: str, out_dir: Path, num_speculative_tokens: int = 7, dtype: str = "keep") -> Path:
    """Write a head of any layout (eagle3, SGLang, vLLM, speculators) in another engine's layout.

    sglang and vllm: eagle3's own layout (both engines load it; vLLM maps `midlayer.` to
    `layers.0.` itself), with the aux layer ids written in each engine's convention.
    speculators: `layers.0.*` names and a `speculators_model_type: eagle3` config whose
    `verifier.name_or_path` is an absolute path or a hub id, so it loads from any directory.
    """
    if fmt not in EXPORT_FORMATS:
        raise UsageError(
            f"unknown --format {fmt!r}",
            f"one of {', '.join(EXPORT_FORMATS)}",
            "eagle3 export --head runs/NAME/head --format sglang --out DIR",
        )
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    # validates names, shapes and aux layer fields before anything is written
    draft, spec = load_any_head(head_dir)
    claim_output(out_dir, "export", EXPORT_FILES, [("--head", head_dir)])
    remove_dead_temps(out_dir)  # an export cut by a kill
    for notice in spec.notices:
        from .console import warn

        warn(notice)
    cfg = _own_layout_config(draft, spec)
    own = cfg.setdefault("eagle3", {})
    if not own.get("target_architectures"):  # heads of other layouts: ask the target, if it is here
        archs = target_architectures(own.get("target"))
        if archs:
            own["target_architectures"] = archs
    if fmt == "speculators":
        support = speculators_support(cfg)
        if support.status == "no":
            raise UsageError(
                f"vLLM cannot serve an EAGLE-3 head on a {support.architecture} target (no SupportsEagle3 in "
                f"{support.source}); a speculators export would fail when vLLM starts",
                "a target family vLLM supports for EAGLE-3 (docs/serve.md lists them)",
                f"eagle3 export --head {head_dir} --format sglang --out DIR   (if SGLang supports the target)",
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").unlink(missing_ok=True)
    tensors = head_state_dict(draft)
    if dtype != "keep":  # floating weights only: d2t (int64) and t2d (bool) are maps
        tensors = {n: t.to(EXPORT_DTYPES[dtype]) if t.is_floating_point() else t for n, t in tensors.items()}
        cfg["torch_dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
    if fmt == "speculators":
        tensors = {n.replace("midlayer.", "layers.0."): t for n, t in tensors.items()}
        cfg = _speculators_config(cfg, num_speculative_tokens)
    atomic_write_tensors(out_dir / HEAD_WEIGHTS, tensors, {"format": "pt"})
    atomic_write_json(out_dir / "config.json", cfg)
    write_manifest(
        out_dir,
        "export",
        format=fmt,
        source=str(head_dir.resolve()),
        source_layout=spec.layout,
        target=(cfg.get("eagle3") or {}).get("target", {}),
        shards=[shard_record(out_dir / HEAD_WEIGHTS)],
    )
    return out_dir
