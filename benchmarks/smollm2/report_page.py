"""docs/results-smollm2.md and the README's results table, rendered from docs/results-smollm2.json through
docs/templates/ (benchmarks/render.py); the figures drawn from it. Every number is a key that a measurement
program wrote (run_bench.py, publish.py, recipes.py, report.py, report_levers.py...); nothing here reads a run.

    .venv/bin/python benchmarks/smollm2/report_page.py            # write the page, its figures, the README table
    .venv/bin/python benchmarks/smollm2/report_page.py --check    # exit 1 if the page or README differ from the JSON
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: the repo root, for `benchmarks`
from benchmarks.render import check_or_write, iv, render_template  # noqa: E402
from benchmarks.smollm2.report_figures import figure_line  # noqa: E402

PAGE, README = REPO / "docs" / "results-smollm2.md", REPO / "README.md"
README_START, README_END = "<!-- results: rendered from docs/results-smollm2.json by benchmarks/smollm2/report_page.py -->", "<!-- /results -->"  # fmt: skip


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def rel(path: str | Path) -> str:
    """A path as a committed page names it: relative to the repository when it is inside it."""
    p = Path(path)
    return str(p.relative_to(REPO)) if p.is_absolute() and p.is_relative_to(REPO) else str(p)


def fail(message: str) -> NoReturn:
    print(f"error: {message}; nothing was written", file=sys.stderr)
    raise SystemExit(2)


def _goal_tokens(w: dict, goal: str) -> str:
    n, corpus = w["tokens_for_tau"].get(goal), w["corpus_tokens"] or w["distinct_tokens"]
    return "never" if n is None else f"~{n / 1e6:,.0f}M distinct tokens ({n / corpus:,.1f}x this corpus)"


def _distinct_tokens(n, per_sample: float | None) -> str:
    if n is None:
        return "never (tau does not grow with data)"
    text = f"{n / 1e6:,.1f}M distinct tokens" if n >= 1e5 else f"{n:,.0f} distinct tokens"
    return text + (f" (~{n / per_sample:,.0f} samples of this corpus's mean length)" if per_sample else "")


def _thin(curve: list[dict], n: int) -> list[dict]:
    """About N points of a curve, evenly spaced, and always its last."""
    shown = curve[:: max(1, len(curve) // n)]
    return shown + ([curve[-1]] if shown[-1] is not curve[-1] else [])


FILTERS = {
    "runs": lambda r: " / ".join(
        f"{x:.2f}" + (f" {iv(i)}" if i else "")
        for x, i in zip(  # a vLLM row's runs
            r["speedup_runs"], r.get("speedup_intervals") or [None] * len(r["speedup_runs"])
        )
    ),  # fmt: skip
    "thin": _thin,
    "nonempty": lambda d: {k: v for k, v in (d or {}).items() if v},
    "nearest": lambda rows, tokens: min(rows, key=lambda r: abs(math.log2(r["tokens"] / tokens))),
    "distinct_tokens": _distinct_tokens,
    "goal_tokens": _goal_tokens,
    "eval_row": lambda d, name: next(
        (r for r in d.get("rows", []) if r["eval"] == name and r["decoder"] == "chain"), None
    ),  # fmt: skip
}


def readme_table(d: dict) -> str:
    return render_template("readme-results.md.j2", d, FILTERS)


def readme_with_table(readme: str, d: dict) -> str:
    head, rest = readme.split(README_START + "\n", 1)
    return head + README_START + "\n" + readme_table(d) + README_END + rest.split(README_END, 1)[1]


def page(d: dict) -> str:
    return render_template("results-smollm2.md.j2", d, FILTERS, figure=figure_line,
                           gpu_check="python tools/gpu_check.py --out gpu_check.json")  # fmt: skip


def write_page(md_path: Path = PAGE, check: bool = False) -> None:
    """The page (and, for the committed page, the README's table and the figures) from MD_PATH's JSON."""
    json_path = md_path.with_suffix(".json")
    if (d := read_json(json_path)) is None:
        fail(f"no {json_path} (the measurement programs write it)")
    pages = {md_path: page(d)} | ({README: readme_with_table(README.read_text(encoding="utf-8"), d)}
                                  if md_path == PAGE else {})  # fmt: skip
    check_or_write(pages, check, json_path, "benchmarks/smollm2/report_page.py")
    if not check:
        from benchmarks.smollm2.report_figures import draw_figures

        print(f"wrote {md_path}; drew {', '.join(draw_figures(d, md_path.parent)) or 'no figure'}")


def save(md_path: Path, data: dict) -> None:
    """DATA as MD_PATH's JSON, then the page rendered from it."""
    md_path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    write_page(md_path)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-md", type=Path, default=PAGE)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page or the README's table is not the JSON's")
    a = ap.parse_args()
    write_page(a.results_md, check=a.check)
