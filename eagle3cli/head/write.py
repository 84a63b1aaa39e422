"""The one writer of head folders: `runs/NAME/head/` in the layout SGLang's and vLLM's
`LlamaForCausalLMEagle3` load, and the other layouts export writes (`speculators_config`).

Files: `config.json` (a Llama config, see `head_config`; every field's place is a row of
`table.FIELDS`), `model.safetensors` (`table.TENSORS`: no `model.` prefix, no embeddings),
`manifest.json` and `README.md`, the model card (`write_card`, rendered by `card.py`). Written
here, by `train` (`save_head`) and `export` (`write_head_files`, in another engine's layout); read,
in any layout, by `read.py` (`read_head`, `load_head`).

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
    head writes `k - 1` for SGLang and `k` for vLLM (`speculate/aux_layers.py`).
  * EAGLE-3.1's norms: top-level `norm_before_fc` and `norm_before_residual`, always written (vLLM
    falls back to the top level when `eagle_config` lacks norm_before_fc; llama.cpp's converter reads
    only the top level), and `input_norm.weight` exactly when norm_before_fc is set (vLLM drops the
    tensor when the flag is off). SGLang reads norm_before_fc from 0.5.23 on, never norm_before_residual (`head.engines.sglang_norm_problem`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import UsageError
from ..node.devices import MATMUL_RELATIVE_ERROR, matmul_precision
from ..run_folder.folders import begin_writing, end_writing
from ..run_folder.manifest import (
    atomic_write_json,
    atomic_write_tensors,
    atomic_write_text,
    read_json,
    shard_record,
    write_manifest,
)
from ..speculate.aux_layers import EXPECTED, aux_layer_problems, sglang_ids, vllm_ids
from ..speculate.draft import Eagle3Draft, norm_flags
from ..speculate.sampling import generator_for
from . import card
from .engines import sglang_first_id_rule
from .read import HeadSpec, load_any_head
from .table import FIELDS, HEAD_ARCH, HEAD_KEYS, HEAD_WEIGHTS, SPECULATORS_ARCH, head_tensor_names

__all__ = [
    "HEAD_FILES",
    "head_config",
    "save_head",
    "speculators_config",
    "update_card",
    "write_card",
    "write_head_files",
]
# What a head folder of ours holds besides its manifest (train's RUN/head, export's --out).
HEAD_FILES = (HEAD_WEIGHTS, "config.json", card.CARD)
# Keys of the draft's own config that are ours, not the engines' (moved into the `eagle3` block).
_OWN_KEYS = ("aux_layer_ids",)


def head_state_dict(draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    """The exported tensors: every draft parameter/buffer but the (frozen, target-owned) embeddings."""
    sd = draft.state_dict()
    names = head_tensor_names(norm_flags(draft.config)[0])
    missing = [n for n in names if n not in sd]
    if missing:
        raise UsageError(f"draft model lacks {missing}", "an eagle3cli.speculate.draft.Eagle3Draft")
    # Contiguous fp copies: safetensors refuses shared/non-contiguous storage.
    return {n: sd[n].detach().to("cpu").contiguous().clone() for n in names}


def head_config(draft: Eagle3Draft, target_identity: dict | None = None, extra: dict | None = None) -> dict:
    """config.json for SGLang/vLLM: a 1-layer Llama config plus the EAGLE-3 fields both engines read."""
    cfg = draft.config.to_dict()
    aux = [int(i) for i in draft.config.aux_layer_ids]
    problems = aux_layer_problems(aux)
    if problems:
        raise UsageError(problems[0], EXPECTED)
    for k in _OWN_KEYS + ("_name_or_path", "transformers_version", "id2label", "label2id", "dtype"):
        cfg.pop(k, None)
    # the target's class decides SGLang's id convention (head/engines.py); recorded, as later exports may lack the target
    archs = (extra or {}).get("target_architectures") or target_architectures(target_identity)
    extra = {**(extra or {}), **({"target_architectures": archs} if archs else {})}
    max_pos = int(cfg.get("max_position_embeddings") or 0)
    if target_identity and target_identity.get("max_position_embeddings"):
        max_pos = max(max_pos, int(target_identity["max_position_embeddings"]))
    rope = cfg.get("rope_parameters") or {}
    norm_before_fc, norm_before_residual = norm_flags(draft.config)
    cfg.update(
        architectures=[HEAD_ARCH],
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
        norm_output=False,
        norm_before_fc=norm_before_fc,
        norm_before_residual=norm_before_residual,
        draft_vocab_size=int(draft.config.draft_vocab_size),
        vocab_size=int(draft.config.vocab_size),
        target_hidden_size=int(draft.config.target_hidden_size),
        max_position_embeddings=max_pos,
        torch_dtype={torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(draft.fc.weight.dtype, "float32"),
        # SGLang adds 1 to these (output of layer k -> input of layer k+1), on its DeepSeek family only to a 1
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": sglang_ids(aux, sglang_first_id_rule(archs)),
            "use_aux_hidden_state": True,
        },
        # vLLM reads this first, as hidden_states[k].
        eagle_aux_hidden_state_layer_ids=vllm_ids(aux),
        eagle3={"aux_layer_ids": aux, "target": target_identity or {}, **extra},
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
    """Write `out_dir/{config.json, model.safetensors, manifest.json}` (manifest last, atomically).
    The caller has claimed `out_dir` (`folders.claim_output(..., marked=True)`): it holds no files of a user's."""
    out_dir = Path(out_dir)
    begin_writing(out_dir, "head")  # before the old manifest goes: a killed export stays ours
    (out_dir / "manifest.json").unlink(missing_ok=True)  # an interrupted export is visibly unfinished
    tensors = head_state_dict(draft)
    atomic_write_tensors(out_dir / HEAD_WEIGHTS, tensors, {"format": "pt"})
    cfg = head_config(draft, target_identity, extra)
    atomic_write_json(out_dir / "config.json", cfg)
    write_manifest(
        out_dir,
        "head",
        target=target_identity or {},
        aux_layer_ids=[int(i) for i in draft.config.aux_layer_ids],
        draft_vocab_size=int(draft.config.draft_vocab_size),
        shards=[shard_record(out_dir / HEAD_WEIGHTS, tensors=len(tensors))],
        **{k: v for k, v in cfg["eagle3"].items() if k not in ("aux_layer_ids", "target")},
    )
    end_writing(out_dir)
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


def write_card(head_dir: Path, evals: list[dict] | None = None, keep_evals: bool = True) -> Path | None:
    """`head_dir/README.md`, the head's model card (head/card.py), unless a README.md there is a user's
    (None then). `evals` replace the card's rows of the same bench; `keep_evals=False` (a new head
    in an old folder) drops the old ones. Its licence, once set, is kept."""
    path = Path(head_dir) / card.CARD
    old = path.read_text(errors="replace") if path.is_file() else ""
    if old and not card.is_ours(old):
        return None
    meta = card.front_matter(old)
    kept = (meta.get("eagle3_eval") or []) if keep_evals else []
    license = meta.get("license") if meta.get("license") != "other" else None
    atomic_write_text(path, card.render(Path(head_dir), card.merged_evals(kept, evals or []), license))
    return path


def update_card(head_dir: Path, evals: list[dict]) -> Path | None:
    """`eagle3 eval`: the acceptance it measured into the head's card, only one eagle3 wrote (None
    when the folder has none, or a user's README.md)."""
    path = Path(head_dir) / card.CARD
    old = path.read_text(errors="replace") if path.is_file() else ""
    if not card.is_ours(old) or not evals:
        return None
    atomic_write_text(path, card.with_evals(old, evals, Path(head_dir)))
    return path


@torch.no_grad()
def self_check(draft: Eagle3Draft, head_dir: Path, seq_len: int = 16, seed: int = 0) -> tuple[float, float]:
    """Reload the export and compare its logits with the in-memory draft's, both on the draft's device
    where it has room (the same kernels), else the reload on the CPU; returns (max |diff|, the bound
    it must stay under: `MATMUL_RELATIVE_ERROR` of the precision the matmuls ran in, times the logits' scale)."""
    reloaded = load_any_head(head_dir)[0]
    reloaded.embed_tokens.weight.copy_(draft.embed_tokens.weight.to("cpu", reloaded.embed_tokens.weight.dtype))
    ref = draft
    device = next(draft.parameters()).device
    try:
        reloaded = reloaded.to(device)
    except torch.OutOfMemoryError:
        reloaded = reloaded.cpu()
    where = next(reloaded.parameters()).device
    g = generator_for("cpu", seed)  # the probe's inputs: drawn on the host, then moved
    cfg = draft.config
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len), generator=g)
    aux = torch.randn(1, seq_len, len(cfg.aux_layer_ids) * cfg.target_hidden_size, generator=g)
    was_training = ref.training
    ref.eval()
    try:
        h_ref = list(ref.ttt_unroll(ids.to(device), aux.to(device, ref.fc.weight.dtype), steps=2))[-1]
        h_new = list(reloaded.ttt_unroll(ids.to(where), aux.to(where, reloaded.fc.weight.dtype), steps=2))[-1]
        want = ref.logits(h_ref).float().cpu()
        diff = (want - reloaded.logits(h_new).float().cpu()).abs().max().item()
    finally:
        ref.train(was_training)
    precisions = {matmul_precision(ref.fc.weight.dtype, device), matmul_precision(reloaded.fc.weight.dtype, where)}
    rel = max(MATMUL_RELATIVE_ERROR[p] for p in precisions)
    return diff, rel * max(1.0, want.abs().max().item())


# ---------------------------------------------------------------- other layouts
def write_head_files(out_dir: Path, tensors: dict[str, torch.Tensor], cfg: dict) -> None:
    """`out_dir/{model.safetensors, config.json}`, each atomically; the caller writes the manifest last."""
    atomic_write_tensors(out_dir / HEAD_WEIGHTS, tensors, {"format": "pt"})
    atomic_write_json(out_dir / "config.json", cfg)


def own_layout_config(draft: Eagle3Draft, spec: HeadSpec) -> dict:
    """config.json in eagle3's layout for a head read from any layout, every field written by
    `head_config` from the head as read (its own `eagle3` block's other keys kept); its target recorded
    as a reference that resolves from anywhere (absolute path or hub id)."""
    from ..model.target import resolvable_reference

    target = dict(spec.target)
    ref = resolvable_reference(target.get("path") or target.get("name_or_path"), base=spec.path)
    if ref:
        target["path"] = ref
    target.pop("name_or_path", None)
    if spec.layout == "eagle3":
        own = read_json(spec.path / "config.json").get("eagle3") or {}
        extra = {k: v for k, v in own.items() if k not in ("aux_layer_ids", "target")}
    else:
        extra = {"converted_from": {"layout": spec.layout, "path": str(spec.path.resolve())}}
    return head_config(draft, target, extra)


EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def layout_files(
    draft: Eagle3Draft, spec: HeadSpec, fmt: str, dtype: str = "keep", num_speculative_tokens: int = 7
) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, config.json) of a read head in `fmt`'s layout: `sglang` and `vllm` (and the GGUF
    converter's input) eagle3's own, `speculators` vLLM's. Every aux id field is written from the ids
    the head was read with, each in its engine's convention (`head_config`); `dtype` casts the floating weights (the
    d2t/t2d maps stay integer); the target and a converted head's source are recorded relative to the
    working directory (the repository) where they lie inside it, so a committed export names no
    folder of the machine that wrote it."""
    from ..model.target import repo_relative

    cfg = own_layout_config(draft, spec)
    own = cfg["eagle3"]
    tensors = head_state_dict(draft)
    if dtype != "keep":
        tensors = {n: t.to(EXPORT_DTYPES[dtype]) if t.is_floating_point() else t for n, t in tensors.items()}
        cfg["torch_dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
    if fmt == "speculators":
        return {n.replace("midlayer.", "layers.0."): t for n, t in tensors.items()}, speculators_config(
            cfg, num_speculative_tokens
        )
    for record in (own.get("target") or {}, own.get("converted_from") or {}):
        if record.get("path"):
            record["path"] = repo_relative(record["path"])
    return tensors, cfg


def speculators_config(cfg: dict, num_speculative_tokens: int) -> dict:
    """eagle3's config.json in vLLM's `speculators` layout: the Llama layer nested (every key but the
    head's own, `table.HEAD_KEYS`), the speculator's fields top-level. EAGLE-3.1's norms beside
    `transformer_layer_config`, where vLLM's `update_eagle3` reads them, always written (a missing
    norm_before_residual means true there)."""
    layer = {k: v for k, v in cfg.items() if k not in HEAD_KEYS}
    layer["architectures"] = ["LlamaForCausalLM"]
    own = cfg.get("eagle3") or {}
    verifier_archs = own.get("target_architectures") or ["LlamaForCausalLM"]
    # the table's rows both layouts write under the same top-level key are copied as they are
    same = {k: cfg.get(k) for k in (f.eagle3 for f in FIELDS if f.eagle3 == f.speculators) if k and "." not in k}
    return {
        **same,
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        "transformer_layer_config": layer,
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
            "verifier": {"name_or_path": (own.get("target") or {}).get("path"), "architectures": verifier_archs},
        },
    }
