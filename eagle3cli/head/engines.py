"""Which target architectures each engine serves with an EAGLE-3 head, read from the engines' source.

An EAGLE-3 head needs the *target* to hand over its aux hidden states, and that is per model class:

  * SGLang calls `model.set_eagle3_layers_to_capture(ids)` on the target and stops at startup,
    after loading the weights, when the class lacks it ("does not implement
    set_eagle3_layers_to_capture"). `SGLANG_EAGLE3_TARGETS` lists the `EntryClass` architectures
    of `sglang/srt/models/*.py` whose class or a base class defines it, as
    `sglang_eagle3_architectures` reads them from SGLang's source (regenerate it with
    `python -m eagle3cli.head.engines` where sglang is installed).
  * vLLM's model runner requires the `SupportsEagle3` interface of the target
    ("Model does not support EAGLE3 interface"). vLLM is not installable here; the two sets below
    are the classes whose declaration was read in vLLM's `model_executor/models/*.py` (2025-26):
    with the interface, and without it in a recent version. Other architectures are unknown: warned
    about, not refused.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

SGLANG_TABLE_VERSION = "0.5.23"
# fmt: off
SGLANG_EAGLE3_TARGETS = frozenset({
    "ApertusForCausalLM", "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "Cosmos3ForConditionalGeneration", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM",
    "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
    "Gemma4AssistantForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedAssistantForCausalLM", "Gemma4UnifiedForConditionalGeneration",
    "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "Glm5NextForConditionalGeneration", "GlmMoeDsaForCausalLM",
    "GptOssForCausalLM", "IQuestCoderForCausalLM", "InternLM3ForCausalLM", "InternS1ProForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "KimiK25ForConditionalGeneration", "Llama4ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM",
    "LongcatFlashForCausalLM", "MellumForCausalLM", "MindSporeForCausalLM", "MiniMaxM2ForCausalLM",
    "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration", "Ministral3ForCausalLM",
    "MistralForCausalLM", "MistralLarge3ForCausalLM", "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
    "Qwen2_5_VLForConditionalGeneration", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration", "SarvamMoEForCausalLM", "TeleFLMForCausalLM",
})
# fmt: on
# Target classes whose `set_eagle3_layers_to_capture` adds 1 to the head's SGLang ids only when the
# first id is 1 (SGLang PR 25454, in 0.5.23): `deepseek_v2.py` (and its subclasses in `glm4_moe.py`,
# `mistral_large_3.py`), `glm4_moe_lite.py`, and Kimi K2.5, which hands the ids to its DeepSeek-V3 language
# model. Every other class adds 1 always. `tests/unit/test_aux_layers.py` reads the rule back from an
# installed SGLang's source.
SGLANG_FIRST_ID_RULE = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "MistralLarge3ForCausalLM",
        "KimiK25ForConditionalGeneration",
    }
)  # fmt: skip


def sglang_first_id_rule(architectures) -> bool:
    """Does SGLang read a head's ids for a target of these `architectures` by the first-id rule?"""
    return any(a in SGLANG_FIRST_ID_RULE for a in architectures or [])


VLLM_EAGLE3_TARGETS = frozenset(
    {
        "LlamaForCausalLM",  # llama.py: SupportsEagle3
        "MistralForCausalLM",  # mistral.py: a LlamaForCausalLM subclass
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "GptOssForCausalLM",
    }
)
VLLM_WITHOUT_EAGLE3 = frozenset({"MixtralForCausalLM", "Gemma2ForCausalLM"})

_TARGET_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")
_NOT_TARGETS = ("Eagle", "NextN", "MTP", "DSpark")  # draft / multi-token-prediction classes


@dataclass(frozen=True)
class Support:
    engine: str
    architecture: str | None
    status: str  # "yes" | "no" | "unknown"
    source: str  # where the answer comes from, for messages

    @property
    def ok(self) -> bool:
        return self.status == "yes"


def _installed_sglang_models() -> tuple[str, Path] | None:
    """(version, sglang/srt/models) of an installed SGLang, without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        from importlib.metadata import version

        v = version("sglang")
    except Exception:  # noqa: BLE001 — a source checkout without metadata
        v = "unknown"
    models = root / "srt" / "models"
    return (v, models) if models.is_dir() else None


def sglang_eagle3_architectures(models_dir: Path) -> frozenset[str]:
    """Architectures in SGLang's model registry (`EntryClass`) whose class, or a base class found
    in the same folder by name, defines `set_eagle3_layers_to_capture` (SGLang's own test is
    `hasattr`). Read from source with `ast`: importing SGLang's models needs CUDA packages."""
    classes: dict[str, list[tuple[list[str], bool]]] = {}
    entries: set[str] = set()
    for f in sorted(Path(models_dir).glob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in node.bases]
                defines = any(
                    (
                        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and n.name == "set_eagle3_layers_to_capture"
                    )
                    or (
                        isinstance(n, ast.Assign)
                        and any(getattr(t, "id", None) == "set_eagle3_layers_to_capture" for t in n.targets)
                    )
                    for n in node.body
                )
                classes.setdefault(node.name, []).append(([b for b in bases if b], defines))
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                v = node.value
                items = v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]
                entries.update(e.id for e in items if isinstance(e, ast.Name))

    def supports(name: str, seen: frozenset = frozenset()) -> bool:
        if name in seen:
            return False
        return any(
            defines or any(supports(b, seen | {name}) for b in bases) for bases, defines in classes.get(name, [])
        )

    return frozenset(
        a for a in entries if a.endswith(_TARGET_SUFFIXES) and not any(x in a for x in _NOT_TARGETS) and supports(a)
    )


def sglang_table() -> tuple[frozenset[str], str]:
    """The SGLang table to use: the committed one, or one read from an installed SGLang of another version."""
    installed = _installed_sglang_models()
    if installed is not None and installed[0] != SGLANG_TABLE_VERSION:
        return sglang_eagle3_architectures(installed[1]), f"the installed SGLang {installed[0]}'s source"
    return SGLANG_EAGLE3_TARGETS, f"SGLang {SGLANG_TABLE_VERSION}'s source"


def target_support(engine: str, architectures: list[str] | None) -> Support:
    """Can `engine` run an EAGLE-3 head on a target of these `architectures` (its config.json)?"""
    archs = [a for a in (architectures or []) if isinstance(a, str)]
    arch = archs[0] if archs else None
    if arch is None:
        return Support(engine, None, "unknown", "the target's config.json names no architectures")
    if engine == "sglang":
        table, source = sglang_table()
        return Support(engine, arch, "yes" if any(a in table for a in archs) else "no", source)
    if any(a in VLLM_EAGLE3_TARGETS for a in archs):
        return Support(engine, arch, "yes", "vLLM's model files (SupportsEagle3)")
    if any(a in VLLM_WITHOUT_EAGLE3 for a in archs):
        return Support(engine, arch, "no", "vLLM's model files (no SupportsEagle3)")
    return Support(engine, arch, "unknown", "not in eagle3's vLLM table")


# ---------------------------------------------------------------- EAGLE-3.1's norms in SGLang
# SGLang's LlamaForCausalLMEagle3 (srt/models/llama_eagle3.py): before 0.5.23 it read neither flag
# (its loader skips a checkpoint name it has no parameter for, so `input_norm.weight` was dropped
# without a word); 0.5.23 reads norm_before_fc (eagle_config first, then the top level, as vLLM)
# and loads input_norm.weight. No version reads norm_before_residual: its first layer always adds
# the raw hidden state as the residual. A head with a flag SGLang does not read would load and
# draft with another model than the one trained. An installed SGLang whose loader names a flag is
# taken at its word; without one the version is unknown, so both flags are refused.
SGLANG_NORM_FLAGS: frozenset[str] = frozenset()


def sglang_norm_flags() -> tuple[frozenset[str], str]:
    """The EAGLE-3.1 norm flags SGLang's EAGLE-3 loader reads, and where that comes from."""
    installed = _installed_sglang_models()
    path = installed[1] / "llama_eagle3.py" if installed else None
    if installed is None or path is None or not path.is_file():
        return SGLANG_NORM_FLAGS, "SGLang's llama_eagle3.py (sgl-project source; not installed here)"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return SGLANG_NORM_FLAGS, f"SGLang {installed[0]} (its llama_eagle3.py could not be read)"
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    flags = frozenset(f for f in ("norm_before_fc", "norm_before_residual") if f in names)
    return flags, f"the installed SGLang {installed[0]}'s llama_eagle3.py"


def sglang_norm_problem(norm_before_fc: bool, norm_before_residual: bool) -> str | None:
    """What is wrong with serving a head with these EAGLE-3.1 norms on SGLang; None when nothing is."""
    supported, source = sglang_norm_flags()
    what = {
        "norm_before_fc": "its input_norm.weight would be skipped without a word",
        "norm_before_residual": "its layer would add the raw hidden state as the residual",
    }
    used = [f for f, on in (("norm_before_fc", norm_before_fc), ("norm_before_residual", norm_before_residual)) if on]
    missing = [f for f in used if f not in supported]
    if not missing:
        return None
    return (
        f"the head is an EAGLE-3.1 head ({' and '.join(missing)}), which SGLang's LlamaForCausalLMEagle3 does "
        f"not read ({source}): {'; '.join(what[f] for f in missing)}, so SGLang would draft with another model "
        "than the one trained"
    )


SGLANG_NORM_FIX = (
    "serve it with vLLM (eagle3 export --format vllm, then eagle3 serve --engine vllm) or llama.cpp (eagle3 export "
    "--format gguf, then eagle3 serve --engine llama.cpp); for SGLang, train a head without --norm-before-fc and "
    "--norm-before-residual"
)


if __name__ == "__main__":  # print the table of the installed SGLang, to refresh SGLANG_EAGLE3_TARGETS
    found = _installed_sglang_models()
    if found is None:
        raise SystemExit("sglang is not installed here")
    print(f"# SGLang {found[0]}")
    print(sorted(sglang_eagle3_architectures(found[1])))
