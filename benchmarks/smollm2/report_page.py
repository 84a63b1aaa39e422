"""docs/results-smollm2.md, rendered from docs/results-smollm2.json through docs/templates/results-smollm2.md.j2
(benchmarks/render.py), and the README's results table from the same JSON. The template holds the prose and the
tables, this module the few formatters they need; every number is read from a key
that a measurement program wrote (run_bench.py, publish.py, recipes.py, levers via report_levers.py,
data_scaling.py via report.py ...). Nothing here reads a run folder.

    .venv/bin/python benchmarks/smollm2/report_page.py            # write the page, its figures, the README table
    .venv/bin/python benchmarks/smollm2/report_page.py --check    # exit 1 if the page or README differ from the JSON
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: the repo root, for `benchmarks`
from benchmarks.render import iv, render_template, write  # noqa: E402
from benchmarks.smollm2.report_figures import DATA_SCALING, LEARNING_CURVE, LEVERS, SWEEP, figure_line  # noqa: E402

PAGE = REPO / "docs" / "results-smollm2.md"
README = REPO / "README.md"
GPU_CHECK = "python tools/gpu_check.py --out gpu_check.json"


def _row(d: dict, name: str, decoder: str = "chain") -> dict | None:
    return next((r for r in d.get("rows", []) if r["eval"] == name and r["decoder"] == decoder), None)


def _runs(r: dict) -> str:
    """A vLLM row's speed-up of each run, with its interval over prompts where it has one."""
    ivs = r.get("speedup_intervals") or [None] * len(r["speedup_runs"])
    return " / ".join(f"{x:.2f}" + (f" {iv(i)}" if i else "") for x, i in zip(r["speedup_runs"], ivs))


def _thin(curve: list[dict], n: int) -> list[dict]:
    """About N points of a curve, evenly spaced, and always its last."""
    shown = curve[:: max(1, len(curve) // n)]
    return shown + ([curve[-1]] if shown[-1] is not curve[-1] else [])


def _distinct_tokens(n, per_sample: float | None) -> str:
    if n is None:
        return "never (tau does not grow with data)"
    text = f"{n / 1e6:,.1f}M distinct tokens" if n >= 1e5 else f"{n:,.0f} distinct tokens"
    return text + (f" (~{n / per_sample:,.0f} samples of this corpus's mean length)" if per_sample else "")


def _goal_tokens(w: dict, goal: str) -> str:
    n, corpus = w["tokens_for_tau"].get(goal), w["corpus_tokens"] or w["distinct_tokens"]
    return "never" if n is None else f"~{n / 1e6:,.0f}M distinct tokens ({n / corpus:,.1f}x this corpus)"


FILTERS = {
    "runs": _runs,
    "thin": _thin,
    "nonempty": lambda d: {k: v for k, v in (d or {}).items() if v},
    "nearest": lambda rows, tokens: min(rows, key=lambda r: abs(math.log2(r["tokens"] / tokens))),
    "distinct_tokens": _distinct_tokens,
    "goal_tokens": _goal_tokens,
    "eval_row": _row,
}
FIGURES = {"learning_curve": LEARNING_CURVE, "sweep": SWEEP, "data_scaling": DATA_SCALING, "levers": LEVERS}


# ---------------------------------------------------------------- the README's results table
README_START, README_END = "<!-- results: rendered from docs/results-smollm2.json by benchmarks/smollm2/report_page.py -->", "<!-- /results -->"  # fmt: skip


def readme_table(d: dict) -> str:
    """Targets x engines: tau and speed-up of the published SmolLM2 head (docs/templates/readme-results.md.j2)."""
    return render_template("readme-results.md.j2", d, FILTERS)


def readme_with_table(readme: str, d: dict) -> str:
    head, rest = readme.split(README_START + "\n", 1)
    tail = rest.split(README_END, 1)[1]
    return head + README_START + "\n" + readme_table(d) + README_END + tail


def page(d: dict) -> str:
    return render_template("results-smollm2.md.j2", d, FILTERS, gpu_check=GPU_CHECK,
                           figure=lambda name: figure_line(FIGURES[name]))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-md", type=Path, default=PAGE)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page or the README's table is not the JSON's")
    a = ap.parse_args()
    write_page(a.results_md, check=a.check)


def write_page(md_path: Path = PAGE, check: bool = False, figures: bool = True) -> None:
    """The page (and, for the committed page, the README's table and the figures) from MD_PATH's JSON."""
    json_path = md_path.with_suffix(".json")
    if not json_path.exists():
        print(f"error: no {json_path} (the measurement programs write it); nothing was written", file=sys.stderr)
        raise SystemExit(2)
    d = json.loads(json_path.read_text(encoding="utf-8"))
    text, readme = page(d), (README.read_text(encoding="utf-8") if md_path == PAGE else None)
    if check:
        stale = [p for p, t in ((md_path, text), (README, readme and readme_with_table(readme, d)))
                 if t is not None and p.read_text(encoding="utf-8") != t]  # fmt: skip
        if stale:
            print(f"{', '.join(map(str, stale))} differ from {json_path}: run {Path(__file__).name}", file=sys.stderr)
            raise SystemExit(1)
        return
    write(md_path, text)
    if readme is not None:
        write(README, readme_with_table(readme, d))
    if figures:
        from benchmarks.smollm2.report_figures import draw_figures

        drawn = draw_figures(d, md_path.parent)
        print(f"wrote {md_path}; drew {', '.join(drawn) or 'no figure'}")


if __name__ == "__main__":
    main()
