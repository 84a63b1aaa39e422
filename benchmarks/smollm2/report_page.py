"""docs/results-smollm2.md, the README's results table and the page's figures, rendered from
docs/results-smollm2.json (through docs/templates/ and benchmarks/render.py; a figure from the keys its section's
table is written from, so a picture cannot disagree with its page). Every number is a key a measurement program
wrote (publish.py, report.py, report_levers.py, recipes.py...); nothing here reads a run folder.

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
from benchmarks.render import check_or_write, iv, pyplot, render_template, save_figure  # noqa: E402

PAGE, README = REPO / "docs" / "results-smollm2.md", REPO / "README.md"
README_START = "<!-- results: rendered from docs/results-smollm2.json by benchmarks/smollm2/report_page.py -->"
README_END = "<!-- /results -->"
CARRY = "humaneval"  # the levers' carry-over bench: a public one no corpus here holds
FIGURES = {  # the template's name for a figure: its file, its alt text
    "learning_curve": ("results-smollm2-learning-curve.png", "held-out tau against trained tokens and CPU seconds"),
    "sweep": ("results-smollm2-sweep.png", "tau and measured speedup of each sweep configuration, fp32 and bf16"),
    "data_scaling": ("results-data-scaling.png",
                     "held-out and MT-bench tau against distinct training tokens, with the fitted log2 law"),
    "recipe_levers": ("results-recipe-levers.png", "MT-bench tau by recipe lever, and its paired gain over K=3"),
    "epoch_curve": ("results-epoch-curve.png", "held-out and MT-bench tau and the train loss after each pass"),
    "data_levers": ("results-data-levers.png",
               "MT-bench tau by lever beside the published head, and each lever's paired gain over the baseline"),
}  # fmt: skip


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def rel(path: str | Path) -> str:
    """A path as a committed page names it: relative to the repository when it is inside it."""
    p = Path(path)
    return str(p.relative_to(REPO)) if p.is_absolute() and p.is_relative_to(REPO) else str(p)


def fail(message: str) -> NoReturn:
    print(f"error: {message}; nothing was written", file=sys.stderr)
    raise SystemExit(2)


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
    "distinct_tokens": _distinct_tokens,
    "goal_tokens": _goal_tokens,
    "nonempty": lambda d: {k: v for k, v in (d or {}).items() if v},
    "nearest": lambda rows, tokens: min(rows, key=lambda r: abs(math.log2(r["tokens"] / tokens))),
    "eval_row": lambda d, name: next(
        (r for r in d.get("rows", []) if (r["eval"], r["decoder"]) == (name, "chain")), None
    ),  # fmt: skip
}


def readme_table(d: dict) -> str:
    return render_template("readme-results.md.j2", d, FILTERS)


def readme_with_table(readme: str, d: dict) -> str:
    head, rest = readme.split(README_START + "\n", 1)
    return head + README_START + "\n" + readme_table(d) + README_END + rest.split(README_END, 1)[1]


def figure_line(name: str) -> str:
    return f"![{FIGURES[name][1]}]({FIGURES[name][0]})"


def page(d: dict) -> str:
    return render_template("results-smollm2.md.j2", d, FILTERS, figure=figure_line,
                           gpu_check="python tools/gpu_check.py --out gpu_check.json")  # fmt: skip


def write_page(md_path: Path = PAGE, check: bool = False) -> None:
    """The page (and, for the committed page, the README's table) from MD_PATH's JSON; then the figures."""
    json_path = md_path.with_suffix(".json")
    if (d := read_json(json_path)) is None:
        fail(f"no {json_path} (the measurement programs write it)")
    pages = {md_path: page(d)}
    if md_path == PAGE:
        pages[README] = readme_with_table(README.read_text(encoding="utf-8"), d)
    check_or_write(pages, check, json_path, "benchmarks/smollm2/report_page.py")
    if not check:
        print(f"wrote {md_path}; drew {', '.join(draw_figures(d, md_path.parent)) or 'no figure'}")


def save(md_path: Path, data: dict) -> None:
    """DATA as MD_PATH's JSON, then the page rendered from it."""
    md_path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    write_page(md_path)


def learning_curve_png(curve: list[dict], out: Path) -> None:
    plt = pyplot()
    fig, (by_tokens, by_cpu) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    # a head trained on across sessions is held out on its sessions' corpus: a second series
    series = {}
    for p in curve:
        series.setdefault(p.get("heldout_set") and f"sessions, held out on {p['heldout_set']}", []).append(p)
    for label, pts in series.items():
        tau = [p["heldout_tau"] for p in pts]
        name = label or ("before the sessions" if len(series) > 1 else None)
        by_tokens.plot([p["tokens"] for p in pts], tau, "o-", ms=3, label=name)
        by_cpu.plot([p["cpu_seconds"] / 3600 for p in pts], tau, "o-", ms=3, label=name)
    if len(series) > 1:
        by_tokens.legend(fontsize=8)
    by_tokens.set_xscale("log", base=2)
    by_tokens.set(xlabel="trained tokens (log2)", ylabel="held-out chain tau, depth 8")
    by_cpu.set(xlabel="CPU hours (core-hours)")
    for ax in (by_tokens, by_cpu):
        ax.grid(alpha=0.3)
    last = curve[-1]
    fig.suptitle(f"learning curve: {last['tokens']:,} tokens, held-out tau {last['heldout_tau']:.3f} at the end")
    save_figure(fig, out)


def sweep_png(sweep: dict, out: Path) -> None:
    plt = pyplot()
    runs = {dt: s for dt, s in sweep.items() if s}
    first = next(iter(runs.values()))
    names = list(first["configurations"])
    fig, (ax_tau, ax_speed) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runs)
    for j, (dt, s) in enumerate(runs.items()):
        xs = [i + (j - (len(runs) - 1) / 2) * width for i in range(len(names))]
        conf = s["configurations"]
        ax_tau.bar(xs, [conf.get(n, {}).get("tau", 0) for n in names], width, label=dt)
        bars = ax_speed.bar(xs, [conf.get(n, {}).get("speedup", 0) for n in names], width, label=dt)
        best = s.get("best")
        if best in names:  # the measured best, with its 90% interval where the sweep gave one
            i = names.index(best)
            lo, hi = s.get("speedup_interval") or (None, None)
            if lo is not None:
                sp = conf[best]["speedup"]
                ax_speed.errorbar([xs[i]], [sp], yerr=[[sp - lo], [hi - sp]], color="black", capsize=3)
            bars[i].set_edgecolor("black")
            bars[i].set_linewidth(1.5)
    ax_speed.axhline(1.0, color="grey", lw=1, ls=":")
    ax_tau.set(ylim=(1.0, None), ylabel="tau (tokens per target pass)")  # tau counts the bonus token: 1 is none
    ax_speed.set(ylabel="speedup vs plain decoding")
    for ax in (ax_tau, ax_speed):
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"eval --sweep, MT-bench, {first.get('prompts')} prompts x {first.get('max_new_tokens')} tokens "
        "(outlined: the measured best, with its 90% interval)"
    )
    save_figure(fig, out)


def levers_png(rows: list[dict], path: Path, start_tau: float | None, what: str) -> None:
    """Left: each arm's MT-bench tau with its 90% interval, beside the published head it started from and the
    baseline. Right: the gain over the baseline paired by prompt (the table's), on MT-bench and, where both
    measured it, on the carry-over bench: unpaired intervals overlap where the paired ones do not."""
    plt = pyplot()
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(11, 0.6 * len(rows) + 2.4), sharey=True)

    def dot(axes, x, interval, y, marker="o", color="#4c72b0", label=None):  # a value and its interval
        axes.plot(interval, [y, y], color=color, lw=2)
        axes.plot([x], [y], marker, color=color, label=label)

    for y, r in enumerate(rows):
        dot(ax, r["mt_bench_tau"], r["mt_bench_tau_interval"], y)
        dot(dx, r["delta_vs_baseline"], r["delta_interval"], y - 0.1, label="MT-bench" if y == 0 else None)
        if (c := f"{CARRY}_delta") in r:
            dot(dx, r[c], r[f"{c}_interval"], y + 0.1, "s", "#dd8452", CARRY if y == 0 else None)
    if start_tau is not None:
        ax.axvline(start_tau, color="grey", ls="--", lw=1, label=f"published head ({start_tau:.3f})")
    base = rows[0]
    ax.axvline(base["mt_bench_tau"], color="#c44e52", lw=0.8, label=f"{base['arm']} ({base['mt_bench_tau']:.3f})")
    dx.axvline(0, color="#c44e52", lw=0.8)
    ax.set_yticks(range(len(rows)), [f"{r['arm']} ({r['mt_bench_tau']:.3f})" for r in rows])
    ax.set_ylim(len(rows) + 0.4, -0.5)  # an empty band under the last arm: the legends never cover a row
    ax.set_xlabel("MT-bench tau (80 first turns, chain d8, 64 new tokens), 90% interval")
    dx.set_xlabel(f"tau gain over {base['arm']}, paired by prompt, 90% interval")
    ax.set_title(what, fontsize=10)
    dx.set_title("Gain over another pass: MT-bench, and does it carry over?", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    dx.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)


def draw_figures(data: dict, docs: Path) -> list[str]:
    """Draw every figure whose key is in `data` into `docs`; the files drawn."""
    drawn: list[str] = []

    def out(name: str) -> Path:
        drawn.append(FIGURES[name][0])
        return docs / FIGURES[name][0]

    if data.get("learning_curve"):
        learning_curve_png(data["learning_curve"], out("learning_curve"))
    if any((data.get("sweep") or {}).values()):
        sweep_png(data["sweep"], out("sweep"))
    if data.get("data_scaling"):
        from benchmarks.stages.data_scaling import plot

        fit, equal = data.get("data_scaling_fit") or {}, data.get("data_scaling_equal_compute")
        fits = {"mt_bench_tau": {k: v for k, v in fit.items() if k != "heldout"}, "heldout_tau": fit.get("heldout")}
        plot(data["data_scaling"], {k: v for k, v in fits.items() if v and "a" in v}, out("data_scaling"),
             ((data.get("data_scaling_settings") or {}).get("corpus") or {}).get("tokens"),
             data.get("data_scaling_whole_corpus"),
             (equal, data["data_scaling_equal_compute_settings"]) if equal else None)  # fmt: skip
    for key, what in (("data_levers", "Data levers at one budget (SmolLM2-135M, from the published head)"),
                      ("recipe_levers", "Recipe levers (SmolLM2-135M; scratch-*: from no head)")):  # fmt: skip
        if data.get(key):
            levers_png(data[key], out(key), (data.get("published") or {}).get("mt_bench_tau"), what)
    if data.get("epoch_curve"):
        from benchmarks.smollm2.epoch_curve import plot as epoch_plot

        epoch_plot(data["epoch_curve"], out("epoch_curve"))
    return drawn


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-md", type=Path, default=PAGE)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page or the README's table is not the JSON's")
    a = ap.parse_args()
    write_page(a.results_md, check=a.check)
