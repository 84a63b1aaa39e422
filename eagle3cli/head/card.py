"""A head's model card (`README.md`): what it was trained on, how well it accepts, how to serve it.

Rendered here from what the run folders already record, and written by `head/write.py` alone:
train and export write it into every head folder, `eagle3 eval` rewrites it with the acceptance it
measured. Hugging Face reads the YAML front matter (base_model, library_name, tags, license,
datasets, model-index); eagle3 reads back only its own `eagle3_eval` rows, so a re-render keeps the
last eval of each bench. A README.md without `MARK` is a user's, and is never replaced.

The trail a card follows: the head's config.json and manifest.json; for train's `RUN/head`,
`RUN/train/manifest.json` (the resolved config, what was trained), its cache's manifest and the
gen-data folders behind it (sources, conversations, tokens, who regenerated them); for an export,
the source head's trail. A folder no longer on this machine is named, not followed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import yaml

CARD = "README.md"
MARK = "<!-- written by eagle3 (train, export, eval): rewritten by each; delete this line to keep your own edits -->"
# Hugging Face dataset ids of the named sources (readers/sources.py); a file or `hf:NAME` is its own
HUB_DATASETS = {
    "sharegpt": "anon8231489123/ShareGPT_Vicuna_unfiltered",
    "sharegpt_sample": "anon8231489123/ShareGPT_Vicuna_unfiltered",
    "gsm8k": "openai/gsm8k",
    "ultrachat": "HuggingFaceH4/ultrachat_200k",
    "humaneval": "openai/openai_humaneval",
}
# which library loads each layout (Hugging Face's library_name); eagle3's own is SGLang's and vLLM's
LIBRARY = {"eagle3": "sglang", "sglang": "sglang", "vllm": "vllm", "speculators": "vllm", "gguf": "gguf"}
BENCH_NAMES = {"mt_bench": "MT-bench", "gsm8k": "GSM8K", "humaneval": "HumanEval", "sharegpt": "ShareGPT (held out)"}


def read_object(path: Path) -> dict:
    """A JSON object from `path`, or {} when it is missing or unreadable: a card names what it lacks."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def front_matter(text: str) -> dict:
    """The YAML metadata between the leading `---` lines, {} when there is none."""
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---\n", 4)
    data = yaml.safe_load(text[4:end]) if end > 0 else None
    return data if isinstance(data, dict) else {}


def is_ours(text: str) -> bool:
    return MARK in text


def card_evals(head: Path) -> list[dict]:
    """The acceptance rows of the card in `head`, [] without one (or with a user's README.md)."""
    path = Path(head) / CARD
    text = path.read_text(errors="replace") if path.is_file() else ""
    return list(front_matter(text).get("eagle3_eval") or []) if is_ours(text) else []


def _trail(head: Path, depth: int = 0) -> dict:
    """{train, cache, data: [(folder, manifest)], export: [manifest...]} behind `head`, as far as it is here."""
    found: dict[str, Any] = {"train": None, "cache": None, "data": [], "exports": []}
    m = read_object(head / "manifest.json")
    if m.get("stage") == "export" and depth < 4:
        found = _trail(Path(str(m.get("source", ""))), depth + 1)
        found["exports"] = [m, *found["exports"]]
        return found
    train = read_object(head.parent / "train" / "manifest.json")
    if train.get("stage") != "train" or Path(str(train.get("head", ""))).resolve() != head.resolve():
        return found
    found["train"] = train
    inputs = train.get("input") or {}
    data_dirs = [inputs["data"], *inputs.get("extra_data", [])] if inputs.get("data") else []
    if inputs.get("cache"):
        found["cache"] = read_object(Path(inputs["cache"]) / "manifest.json") or {"missing": inputs["cache"]}
        data_dirs = [((found["cache"].get("data") or {}).get("dir"))] if found["cache"].get("data") else []
    found["data"] = [(d, read_object(Path(d) / "manifest.json")) for d in data_dirs if d]
    return found


def source_names(data: list[tuple[str, dict]]) -> list[str]:
    return [str(i.get("spec")) for _, m in data for i in (m.get("inputs") or []) if i.get("spec")]


def hub_datasets(sources: list[str]) -> list[str]:
    out = []
    for s in sources:
        name = s.split(":")[1] if s.startswith("hf:") else HUB_DATASETS.get(s.split(":")[0])
        if name and name not in out:
            out.append(name)
    return out


def base_model(target: dict) -> str:
    """The target as Hugging Face names it: a hub id as recorded, else the `_name_or_path` of the local
    folder's config.json when that is a hub id, else the recorded path."""
    ref = str(target.get("path") or "")
    local = Path(ref)
    if ref and not local.exists() and ref.count("/") == 1:
        return ref
    named = str(read_object(local / "config.json").get("_name_or_path") or "")
    if named.count("/") == 1 and not Path(named).exists():
        return named
    from ..model.target import repo_relative  # a local target: no path of the machine that wrote the card

    return repo_relative(ref) if ref else "unknown"


def eval_rows(report: dict, head_path: Path, command: str) -> list[dict]:
    """The card's rows for one head from eval's report.json: one per mode, acceptance by depth."""
    rows = []
    for per_head in (report.get("heads") or {}).values():
        if Path(str((per_head.get("head") or {}).get("path", ""))).resolve() != Path(head_path).resolve():
            continue
        for mode in ("chain", "tree"):
            stats = per_head.get(mode)
            if not stats:
                continue
            acc = stats.get("acceptance") or {}
            rows.append(
                {
                    "bench": report.get("bench"),
                    "mode": mode,
                    "turns": report.get("turns"),
                    "temperature": report.get("temperature"),
                    "depth": report.get("depth"),
                    "prompts": report.get("units"),
                    "max_new_tokens": report.get("max_new_tokens"),
                    "tau": round(float(acc.get("tau", 0.0)), 3),
                    "tau_interval": [round(float(x), 3) for x in acc.get("tau_interval") or []],
                    "alpha_by_depth": [
                        None if r.get("alpha") is None else round(float(r["alpha"]), 3)
                        for r in acc.get("per_depth") or []
                    ],
                    "speedup_vs_plain": round(float(stats.get("speedup_vs_plain") or 0.0), 3),
                    "greedy_mismatches": (stats.get("lossless") or {}).get("mismatches"),
                    "command": command,
                }
            )
    return rows


def merged_evals(old: list[dict], new: list[dict]) -> list[dict]:
    """The last eval of each (bench, mode, turns, temperature): a new row replaces its old one."""

    def key(r: dict) -> tuple:
        return (r.get("bench"), r.get("mode"), r.get("turns"), r.get("temperature"))

    fresh = {key(r) for r in new}
    return [r for r in old if key(r) not in fresh] + list(new)


def _eval_metadata(name: str, evals: list[dict]) -> dict:
    """model-index (Hugging Face's evaluation results: tau per bench) and eagle3's own rows."""
    if not evals:
        return {}
    return {
        "model-index": [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": "text-generation", "name": "speculative decoding"},
                        "dataset": {"type": str(r["bench"]), "name": BENCH_NAMES.get(str(r["bench"]), str(r["bench"]))},
                        "metrics": [
                            {
                                "type": "acceptance_length",
                                "name": f"tau, {r['mode']} depth {r['depth']}, T={r['temperature']}",
                                "value": r["tau"],
                            }
                        ],
                    }
                    for r in evals
                ],
            }
        ],
        "eagle3_eval": evals,
    }


def with_evals(text: str, evals: list[dict], head: Path) -> str:
    """An eagle3 card `text` with `evals` merged into its rows: the metadata's and the Acceptance
    section only, so what the card says of data and recipe (maybe from run folders gone since) stays."""
    meta = front_matter(text)
    rows = merged_evals(list(meta.pop("eagle3_eval", None) or []), evals)
    index = meta.pop("model-index", None) or [{}]
    meta.update(_eval_metadata(str(index[0].get("name") or Path(head).name), rows))
    body = text[text.find("\n---\n", 4) + 5 :]
    start = body.find("\n## Acceptance\n")
    end = body.find("\n## ", start + 1)
    if start >= 0 and end > start:
        body = body[: start + 16] + "\n" + "\n".join(_eval_section(rows, str(head))) + "\n" + body[end:]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n" + body


def _data_section(trail: dict) -> list[str]:
    train, cache, data = trail["train"], trail["cache"], trail["data"]
    if train is None:
        return ["The training run is not on this machine: its data is not recorded here."]
    lines = []
    for folder, m in data:
        if not m:
            lines.append(f"- `{folder}`: not on this machine")
            continue
        counts, tokens = m.get("counts") or {}, m.get("tokens") or {}
        conversations = counts.get("written", counts.get("records"))
        inputs = ", ".join(f"{i.get('spec')} ({i.get('rows', '?')} rows)" for i in m.get("inputs") or []) or "—"
        if m.get("regenerated"):
            engine = m.get("engine") or {}
            by = engine.get("version") or m.get("backend") or "the target"
            who = f"answers regenerated by the target ({m.get('backend')} backend, {by})"
        else:
            who = "original answers (not regenerated)"
        lines.append(
            f"- `{folder}`: {conversations} conversations from {inputs}; {who}; "
            f"{tokens.get('prompt', '?')} prompt + {tokens.get('completion', '?')} completion tokens"
        )
    if cache and not cache.get("missing"):
        c = cache.get("counts") or {}
        lines.append(f"- cache: {c.get('samples')} samples, {c.get('tokens')} tokens ({cache.get('storage')} storage)")
    samples = train.get("trained_samples")  # a count, or (a published head's) which samples of which folder
    lines.append(
        f"- trained on {f'{samples} samples' if isinstance(samples, int) else samples} "
        f"({train.get('trained_sample_tokens')} tokens), "
        f"{train.get('steps')} steps, {train.get('tokens_seen')} tokens seen; stopped: {train.get('stopped')}"
    )
    return lines


def _eval_section(evals: list[dict], head: str) -> list[str]:
    if not evals:
        return [f"Not evaluated yet: `eagle3 eval --head {head} --bench mt_bench` writes its acceptance here."]
    lines = [
        "tau: tokens per target pass (accepted draft tokens + the target's own); alpha_k: acceptance at depth k.",
        "",
        "| bench | turns | decoder | depth | T | prompts | tau (95% interval) | alpha by depth | speed-up vs plain |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in evals:
        ci = r.get("tau_interval") or []
        interval = f" ({ci[0]}-{ci[1]})" if len(ci) == 2 else ""
        alphas = " ".join("-" if a is None else f"{a:.2f}" for a in r.get("alpha_by_depth") or []) or "-"
        lines.append(
            f"| {BENCH_NAMES.get(str(r['bench']), r['bench'])} | {r.get('turns')} | {r['mode']} | {r['depth']} | "
            f"{r['temperature']} | "
            f"{r['prompts']} | {r['tau']}{interval} | {alphas} | {r.get('speedup_vs_plain')} |"
        )
    lines += ["", "Measured with:", "", "```bash", *dict.fromkeys(r["command"] for r in evals), "```"]
    return lines


def _serve_section(head: str, target: str, layout: str) -> list[str]:
    if layout == "gguf":
        return [
            "```bash",
            f"eagle3 serve --engine llama.cpp --target {head}/target.gguf --head {head}/head.gguf",
            f"llama-server -m {head}/target.gguf -md {head}/head.gguf --spec-type draft-eagle3 --spec-draft-n-max 3 --metrics",
            "```",
        ]
    spec = json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": 3})
    gguf = f"{head.rstrip('/')}-gguf"
    sglang = [
        "# SGLang (eagle3 serve checks the head against the target, then starts the engine)",
        f"eagle3 serve --engine sglang --target {target} --head {head}",
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 \\",
        f"    --speculative-draft-model-path {head} --speculative-num-steps 3 --speculative-eagle-topk 1 \\",
        "    --speculative-num-draft-tokens 4",
    ]
    if layout == "speculators":  # vLLM's layout, which SGLang does not load: eagle3 export --format sglang does
        sglang = [f"# SGLang: this layout is vLLM's; eagle3 export --head {head} --format sglang --out DIR first"]
    return [
        "```bash",
        *sglang,
        "# vLLM",
        f"eagle3 serve --engine vllm --target {target} --head {head}",
        f"vllm serve {target} --speculative-config {shlex.quote(spec)}",
        "# llama.cpp: both as GGUF files (eagle3 export converts with llama.cpp's own converter)",
        f"eagle3 export --head {head} --target {target} --format gguf --out {gguf}",
        f"eagle3 serve --engine llama.cpp --target {gguf}/target.gguf --head {gguf}/head.gguf",
        f"llama-server -m {gguf}/target.gguf -md {gguf}/head.gguf --spec-type draft-eagle3 --spec-draft-n-max 3 --metrics",
        "```",
        "",
        "`eagle3 serve ... --dry-run` prints the engine's exact command; `eagle3 eval --sweep` measures the best "
        "steps/topk for this machine.",
    ]


def render(
    head: Path,
    evals: list[dict] | None = None,
    license: str | None = None,
    trail: dict | None = None,
    recipe: list[str] | None = None,
    base: str | None = None,
) -> str:
    """The card of the head folder `head` (its config.json, manifest.json and trail) with `evals` rows.
    A head whose run folders are gone (a published one) is given its `trail`, `recipe` lines and `base`
    model (its hub id, where the target folder does not say it)."""
    head = Path(head)
    manifest = read_object(head / "manifest.json")
    # a GGUF export has no config.json: its source head's says what the head is
    cfg = read_object(head / "config.json") or read_object(Path(str(manifest.get("source", ""))) / "config.json")
    own = cfg.get("eagle3") or {}
    layout = str(manifest.get("format") or ("speculators" if cfg.get("speculators_model_type") else "eagle3"))
    target = own.get("target") or manifest.get("target") or {}
    trail = trail or _trail(head)
    evals = evals or []
    name = f"{head.resolve().parent.name}-head" if head.resolve().name == "head" else head.resolve().name
    meta: dict[str, Any] = {
        "base_model": base or base_model(target),
        "library_name": LIBRARY.get(layout, "sglang"),
        "license": license or "other",
        "tags": list(dict.fromkeys(["eagle3", "speculative-decoding", "draft-model", "eagle3cli", layout])),
        "datasets": hub_datasets(source_names(trail["data"])),
        **_eval_metadata(name, evals),
    }
    target_ref = str(target.get("path") or "TARGET")
    layer = cfg.get("transformer_layer_config") or cfg
    config = (trail["train"] or {}).get("config")
    exports = [f"`eagle3 export --head {e.get('source')} --format {e.get('format')}`" for e in trail["exports"]]
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        MARK,
        "",
        f"# {name}",
        "",
        f"An EAGLE-3 draft head for `{meta['base_model']}`, written by eagle3 (the `eagle3cli` package)"
        f" in the {layout} layout{' (' + ', then '.join(exports) + ')' if exports else ''}.",
        "",
        "## Target",
        "",
        f"- `{target_ref}`: {target.get('num_hidden_layers')} layers, hidden size {target.get('hidden_size')}, "
        f"vocabulary {target.get('vocab_size')} (fingerprint {target.get('fingerprint')}, chat template "
        f"{target.get('chat_template_hash')})",
        f"- head: one decoder layer, draft vocabulary {cfg.get('draft_vocab_size')}, aux layers "
        f"{own.get('aux_layer_ids')}, {cfg.get('torch_dtype') or layer.get('torch_dtype')}",
        "",
        "## Data",
        "",
        *_data_section(trail),
        "",
        "## Recipe",
        "",
        *(
            recipe
            or (
                ["train's resolved config (a recipe: `eagle3 train --recipe FILE`):", "", "```yaml"]
                + [yaml.safe_dump({"train": config}, sort_keys=False).rstrip(), "```"]
                if config
                else ["The training run's config is not on this machine."]
            )
        ),
        "",
        "## Acceptance",
        "",
        *_eval_section(evals, str(head)),
        "",
        "## Serve",
        "",
        *_serve_section(str(head), target_ref, layout),
        "",
    ]
    return "\n".join(lines)
