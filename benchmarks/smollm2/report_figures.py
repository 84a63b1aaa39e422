"""The results page's figures, drawn from the keys of docs/results-smollm2.json that its tables are
written from, so a picture cannot disagree with its page; report_page.py links each under its section
(`figure_line`) and draws them with the page. data_scaling's is drawn by benchmarks/stages/data_scaling.py."""

from __future__ import annotations

from pathlib import Path

from benchmarks.render import pyplot, save

CARRY = "humaneval"  # the levers' carry-over bench: a public one no corpus here holds
FIGURES = {  # the page's name for a figure: its file, its alt text
    "learning_curve": ("results-smollm2-learning-curve.png", "held-out tau against trained tokens and CPU seconds"),
    "sweep": ("results-smollm2-sweep.png", "tau and measured speedup of each sweep configuration, fp32 and bf16"),
    "data_scaling": ("results-data-scaling.png",
                     "held-out and MT-bench tau against distinct training tokens, with the fitted log2 law"),
    "levers": ("results-data-levers.png",
               "MT-bench tau by lever beside the published head, and each lever's paired gain over the baseline"),
}  # fmt: skip


def figure_line(name: str) -> str:
    return f"![{FIGURES[name][1]}]({FIGURES[name][0]})"


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
    by_tokens.set_xlabel("trained tokens (log2)")
    by_tokens.set_ylabel("held-out chain tau, depth 8")
    by_cpu.set_xlabel("CPU hours (core-hours)")
    for ax in (by_tokens, by_cpu):
        ax.grid(alpha=0.3)
    last = curve[-1]
    fig.suptitle(f"learning curve: {last['tokens']:,} tokens, held-out tau {last['heldout_tau']:.3f} at the end")
    save(fig, out)


def sweep_png(sweep: dict, out: Path) -> None:
    plt = pyplot()
    runs = {dt: s for dt, s in sweep.items() if s}
    names = list(next(iter(runs.values()))["configurations"])
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
    ax_tau.set_ylim(bottom=1.0)  # tau counts the bonus token: 1 is no speculation
    ax_tau.set_ylabel("tau (tokens per target pass)")
    ax_speed.set_ylabel("speedup vs plain decoding")
    for ax in (ax_tau, ax_speed):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    first = next(iter(runs.values()))
    fig.suptitle(
        f"eval --sweep, MT-bench, {first.get('prompts')} prompts x {first.get('max_new_tokens')} tokens "
        "(outlined: the measured best, with its 90% interval)"
    )
    save(fig, out)


def levers_png(rows: list[dict], path: Path, start_tau: float | None) -> None:
    """Left: each arm's MT-bench tau with its 90% interval, beside the published head it started from and the
    baseline. Right: the gain over the baseline paired by prompt (the table's), on MT-bench and, where both
    measured it, on the carry-over bench: unpaired intervals overlap where the paired ones do not."""
    plt = pyplot()
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(11, 0.6 * len(rows) + 2.4), sharey=True)
    ys = list(range(len(rows)))
    for y, r in zip(ys, rows):
        lo, hi = r["mt_bench_tau_interval"]
        ax.plot([lo, hi], [y, y], color="#4c72b0", lw=2)
        ax.plot([r["mt_bench_tau"]], [y], "o", color="#4c72b0")
        lo, hi = r["delta_interval"]
        dx.plot([lo, hi], [y - 0.1, y - 0.1], color="#4c72b0", lw=2)
        dx.plot([r["delta_vs_baseline"]], [y - 0.1], "o", color="#4c72b0", label="MT-bench" if y == 0 else None)
        if f"{CARRY}_delta" in r:
            lo, hi = r[f"{CARRY}_delta_interval"]
            dx.plot([lo, hi], [y + 0.1, y + 0.1], color="#dd8452", lw=2)
            dx.plot([r[f"{CARRY}_delta"]], [y + 0.1], "s", color="#dd8452", label=CARRY if y == 0 else None)
    if start_tau is not None:
        ax.axvline(start_tau, color="grey", ls="--", lw=1, label=f"published head ({start_tau:.3f})")
    ax.axvline(
        rows[0]["mt_bench_tau"], color="#c44e52", lw=0.8, label=f"{rows[0]['arm']} ({rows[0]['mt_bench_tau']:.3f})"
    )
    dx.axvline(0, color="#c44e52", lw=0.8)
    ax.set_yticks(ys, [f"{r['arm']} ({r['mt_bench_tau']:.3f})" for r in rows])
    ax.set_ylim(len(rows) + 0.4, -0.5)  # an empty band under the last arm: the legends never cover a row
    ax.set_xlabel("MT-bench tau (80 first turns, chain d8, 64 new tokens), 90% interval")
    dx.set_xlabel(f"tau gain over {rows[0]['arm']}, paired by prompt, 90% interval")
    ax.set_title("Data levers at one budget (SmolLM2-135M, from the published head)", fontsize=10)
    dx.set_title("Gain over another pass: MT-bench, and does it carry over?", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    dx.legend(loc="lower right", fontsize=8)
    save(fig, path)


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
    if data.get("data_levers"):
        levers_png(data["data_levers"], out("levers"), (data.get("published") or {}).get("mt_bench_tau"))
    return drawn
