"""docs/results.md rendered from docs/results.json through docs/templates/results.md.j2 (benchmarks/render.py): the paper's claims at small scale
and the toolkit's own figures, from one `make bench` run.

    .venv/bin/python benchmarks/tiny/report.py --results runs/bench/results.json   # keep a run's data, render, plot
    .venv/bin/python benchmarks/tiny/report.py --check   # exit 1 if docs/results.md is not docs/results.json's

run_bench.py writes runs/bench/results.json; its numbers (not the machine's paths) become docs/results.json.
The reading of each claim is derived from the numbers (reproduced or not), never hard-coded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: the repo root, for `benchmarks`
from benchmarks.render import check_or_write, pyplot, render_template, save_figure  # noqa: E402

PAGE = REPO / "docs" / "results.md"
KEPT = ("machine", "evals", "speed", "toolkit", "commands", "minutes", "work_minutes")


def fmt(x, nd=3) -> str:
    return "–" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


FILTERS = {
    "t": fmt,
    "verdict": lambda ok: "**reproduced**" if ok else "**not reproduced**",
    "taus": lambda evals: {n: e["chain"]["tau"] for n, e in evals.items()},
    "alphas": lambda evals: {n: e["chain"]["alpha"] for n, e in evals.items()},
    "alpha_len": lambda name, evals: len(evals[name]["chain"]["alpha"]),
    "mean": lambda xs: sum(xs) / len(xs) if xs else 0.0,
    "pick": lambda d, *keys: {k: d[k] for k in keys if k in d},
}


def page(d: dict) -> str:
    return render_template("results.md.j2", d, FILTERS)


def page_data(r: dict) -> dict:
    """What docs/results.json keeps of a run's results.json: its numbers, not the machine's paths."""
    repo = str(REPO) + "/"
    data = {k: r[k] for k in KEPT if k in r} | {"settings": {k: r["settings"][k] for k in ("samples", "eval_prompts")}}
    data["evals"] = {n: {"chain": {k: e["chain"][k] for k in ("tau", "alpha")}} for n, e in r["evals"].items()}
    return data | {"commands": [c.replace(repo, "") for c in r["commands"]]}


def plot_alpha(evals: dict, groups: dict[str, str], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name, label in groups.items():
        a = evals[name]["chain"]["alpha"]
        ax.plot(range(1, len(a) + 1), [float("nan") if x is None else x for x in a], "o-", label=label)
    ax.set(xlabel="draft depth k", ylabel="α_k (conditional acceptance)", title=title, ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=120)


def plot_data(evals: dict, sizes: dict[str, int], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    xs = list(sizes.values())
    ax.plot(xs, [evals[n]["chain"]["tau"] for n in sizes], "o-", label="regenerated (target's own answers)")
    if "orig" in evals:
        ax.plot([max(xs)], [evals["orig"]["chain"]["tau"]], "s", color="C3", label="original GSM8K answers")
    ax.set(xlabel="training conversations", ylabel="τ at depth 8 (tokens / target pass)", title="data size")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=None, help="a run's results.json: kept as the page's JSON, plotted")
    ap.add_argument("--out", type=Path, default=PAGE)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is not its JSON's")
    args = ap.parse_args()
    json_path = args.out.with_suffix(".json")
    if args.results is not None:
        json_path.write_text(
            json.dumps(page_data(json.loads(args.results.read_text())), indent=2, ensure_ascii=False) + "\n"
        )
    if not json_path.exists():
        print(f"error: no {json_path} (run benchmarks/tiny/run_bench.py, or pass --results); nothing was written",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    d = json.loads(json_path.read_text())
    check_or_write({args.out: page(d)}, args.check, json_path, Path(__file__).name)
    if args.check:
        return
    if args.results is not None:  # figures from the run's full-precision numbers
        ev, docs, n1 = d["evals"], args.out.parent, d["settings"]["samples"]
        plot_alpha(ev, {"ttt7": "TTT, 7 steps", "ttt1": "no TTT (1 step)"}, docs / "results-ttt.png",
                   "TTT keeps acceptance flat")  # fmt: skip
        plot_alpha(ev, {"ttt7": "low+mid+high [2,6,9]", "top": "top layer only [11]"}, docs / "results-fusion.png",
                   "multi-layer fusion vs top layer")  # fmt: skip
        plot_data(ev, {"regen1x": n1, "regen2x": 2 * n1, "ttt7": 4 * n1}, docs / "results-data.png")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
