"""The `equal_budget` key of docs/results-smollm2.json (report_page.py renders it): rows at one CPU budget
beside the recipe table (issue 31), each from a `benchmarks/smollm2/recipes.py --out DIR` folder:
EAGLE-3.1's norms over the chosen recipe, and the chosen recipe on caches of each storage (bf16,
fp8, compact) of the same conversations.

Held-out tau is scored on the run's own cache, so it compares rows on one cache (the norms);
between storages only `eagle3 eval` on MT-bench is fair (it runs the real target, not the cached
features), and a storage passes when its eval tau is within 2% of bf16's (the issue's bar).

Used by report.py (`--equal-budget DIR ...`); nothing here measures.
"""

from __future__ import annotations

import json
from pathlib import Path

STORAGE_BAR = 0.02  # the most eval tau a cheaper cache storage may lose against bf16


def _cache_facts(cache: Path) -> dict:
    m = json.loads((cache / "manifest.json").read_text())
    tokens = m["counts"]["tokens"]
    per_token = m["bytes_per_token"]["measured"]
    return {
        "storage": m["storage"],
        "samples": m["counts"]["samples"],
        "tokens": tokens,
        "bytes_per_token": per_token,
        "gb": round(per_token * tokens / 1e9, 3),
    }


def equal_budget_json(folders: list[Path], base: str = "chosen") -> dict:
    """Every row of every folder, with the cache it trained on; ratios against `base` on bf16."""
    rows, budgets = [], set()
    for folder in folders:
        r = json.loads((folder / "recipes.json").read_text())
        budgets.add(r["budget_cpu_s"])
        cache = _cache_facts(Path(r["cache"]))
        for name, row in r["rows"].items():
            rows.append(
                {
                    "row": name,
                    "what": row["what"],
                    "flags": row["flags"],
                    "storage": cache["storage"],
                    "steps": row["steps"],
                    "tokens": row["tokens"],
                    "heldout_tau": round(row["heldout_tau"], 4),
                    "eval_tau": round(row["eval_tau"], 4) if row.get("eval_tau") else None,
                    "cache": cache,
                }
            )
    if len(budgets) != 1:
        raise ValueError(f"rows at different budgets {sorted(budgets)}: they are not comparable")
    ref = next((x for x in rows if x["row"] == base and x["storage"] == "bf16"), None)
    if ref is None:
        raise ValueError(f"no `{base}` row on a bf16 cache to compare against")
    for x in rows:
        if x["storage"] == ref["storage"]:
            x["heldout_vs_base"] = round(x["heldout_tau"] / ref["heldout_tau"], 4)
        if x["eval_tau"] and ref["eval_tau"]:
            x["eval_vs_base"] = round(x["eval_tau"] / ref["eval_tau"], 4)
    storage = {
        x["storage"]: {
            "eval_tau": x["eval_tau"],
            "eval_vs_bf16": x["eval_vs_base"],
            "within_bar": 1 - x["eval_vs_base"] <= STORAGE_BAR,
            "bytes_per_token": x["cache"]["bytes_per_token"],
        }
        for x in rows
        if x["row"] == base and x["storage"] != "bf16" and "eval_vs_base" in x
    }
    return {"budget_cpu_s": budgets.pop(), "base": base, "rows": rows, "storage_vs_bf16": storage}
