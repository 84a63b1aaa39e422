"""The eval report on screen (rich tables) and as a plot (acceptance.png)."""

from __future__ import annotations

from pathlib import Path

from ..console import log, print_table
from ..run_folder.manifest import atomic_write
from ..speculate.acceptance import TAU_NOTE


def _f(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ci(pair) -> str:
    return f"[{pair[0]:.2f}, {pair[1]:.2f}]"


def print_report(report: dict) -> None:
    _acceptance_tables(report)
    _speed_table(report)
    if "comparison" in report:
        _comparison_tables(report["comparison"])
    if "sweep" in report:
        _sweep_table(report["sweep"], report["depth"])
    if "sampling_check" in report:
        sc = report["sampling_check"]
        log(
            f"sampling check ({sc['draws']} draws each, {sc['test']}): min p = {sc['min_p_value']:.3g}, "
            f"{'consistent with the target distribution' if sc['passed'] else 'DISTRIBUTIONS DIFFER'}"
        )
    r = report["recommended"]
    log(
        f"recommended for serve: steps={r['steps']} topk={r['topk']} num_draft_tokens={r['num_draft_tokens']} "
        f"(measured {r['speedup']}x {_ci(r['speedup_interval'])}; from {r['from']})"
    )
    for note in r.get("notes", []):
        log(f"note: {note}")


def _acceptance_tables(report: dict) -> None:
    """Per head and mode: acceptance by depth, conditional and unconditional, tau(k)."""
    for label, modes in report["heads"].items():
        for mode in ("chain", "tree"):
            st = modes.get(mode)
            if not st:
                continue
            acc = st["acceptance"]
            est = acc.get("tau_by_depth_estimate")
            rows = [
                [
                    r["depth"],
                    f"{r['accepted']}/{r['attempts']}",
                    _f(r["alpha"]),
                    _f(r["unconditional"]),
                    # tau(k) by depth exists for chains only (a tree's depth is not a chain length)
                    *(
                        [_f(est[r["depth"]]) + (" (measured)" if r["depth"] == report["depth"] else " (estimate)")]
                        if est
                        else []
                    ),
                ]
                for r in acc["per_depth"]
            ]
            print_table(
                f"{label}: acceptance by depth ({mode}, {report['bench']}); {acc['alpha_definition']}",
                ["depth k", "accepted/attempts", "alpha_k (cond.)", "P(reach k)", *(["tau(k)"] if est else [])],
                rows,
            )


def _speed_table(report: dict) -> None:
    """The baselines and every decoder: tau, tokens/s, speedup with its interval, losslessness."""
    base = report["baselines"]
    ref: dict = {}
    rows = [["plain loop", "", "1.000", f"{base['plain']['tokens_per_s']:.1f}", "1.00x", "", "-"]]
    if base["generate"]:
        rows.append(
            [
                "transformers generate",
                "",
                "1.000",
                f"{base['generate']['tokens_per_s']:.1f}",
                f"{base['generate']['tokens_per_s'] / base['plain']['tokens_per_s']:.2f}x",
                "",
                "-",
            ]
        )
    for label, modes in report["heads"].items():
        for mode in ("chain", "tree"):
            st = modes.get(mode)
            if not st:
                continue
            ll = st["lossless"]
            rows.append(
                [
                    f"{label} {mode}",
                    modes["head"]["layout"],
                    f"{st['acceptance']['tau']:.3f} {_ci(st['acceptance']['tau_interval'])}",
                    f"{st['speed']['tokens_per_s']:.1f}",
                    f"{st['speedup_vs_plain']:.2f}x",
                    _ci(st["speedup_interval"]),
                    (
                        f"{ll['mismatches']}/{ll['compared']}"
                        + (f" (+{ll['near_ties']} near tie)" if ll.get("near_ties") else "")
                    )
                    if ll["compared"]
                    else "n/a (sampling)",
                ]
            )
            ref = ll.get("reference") or ref
    print_table(
        f"speed (wall clock, same run); {TAU_NOTE}",
        ["decoder", "layout", "tau [90%]", "tok/s", "vs plain", "90% interval", "greedy mismatches"],
        rows,
    )
    if ref:
        log(
            f"greedy losslessness: against {ref['reference']}, {ref['dtype']} on {ref['device']} ({ref['matmuls']} matmuls): {ref['definition']}"
        )


def _comparison_tables(cmp: dict) -> None:
    """Every head against the reference, per mode: tau ratio and its paired interval."""
    for mode, crows in cmp["modes"].items():
        print_table(
            f"head comparison ({mode}), same prompts; tau ratio vs {cmp['reference']}, {cmp['interval']}",
            ["head", "layout", "tau", "tau ratio", "interval", "prompts +/-/=", "verdict"],
            [
                [
                    r["head"],
                    r["layout"],
                    f"{r['tau']:.3f}",
                    f"{r['tau_ratio_vs_reference']:.3f}",
                    _ci(r["tau_ratio_interval"]),
                    "/".join(str(x) for x in r["prompts_better_worse_equal"]),
                    r.get("verdict", "(reference)"),
                ]
                for r in crows
            ],
        )


def _sweep_table(sw: dict, depth: int) -> None:
    """Each measured configuration of --sweep: tau, its depth-D estimate, speedup, ties."""
    print_table(
        f"sweep: measured runs ({len(sw['prompts'])} prompts x {sw['repeats']} repeats, "
        f"{sw['max_new_tokens']} new tokens); tau estimate = truncated depth-{depth} chain",
        ["config", "tau", "tau estimate (error)", "speedup", "90% interval", "per repeat", "tied"],
        [
            [
                r["name"],
                f"{r['tau']:.3f}",
                f"{r['tau_estimate_from_depth_D']:.3f} ({r['tau_error']:+.3f})" if "tau_error" in r else "-",
                f"{r['speedup']:.2f}x",
                _ci(r["speedup_interval"]),
                " ".join(f"{x:.2f}" for x in r["speedup_per_repeat"]),
                "yes" if r["tied_with_best"] else "",
            ]
            for r in sw["configurations"]
        ],
    )


def plot(path: Path, report: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = report.get("sweep")
    fig, axes = plt.subplots(1, 3 if sweep else 2, figsize=(17 if sweep else 11.5, 4.4))
    a1, a2 = axes[0], axes[1]
    for label, modes in report["heads"].items():
        color = None
        for mode, style in (("chain", "o-"), ("tree", "^:")):
            st = modes.get(mode)
            if not st:
                continue
            rows = st["acceptance"]["per_depth"]
            ks = [r["depth"] for r in rows]
            line = a1.plot(
                ks,
                [r["alpha"] if r["alpha"] is not None else float("nan") for r in rows],
                style,
                color=color,
                label=f"{label} {mode} alpha_k",
            )
            color = line[0].get_color()
            a1.set_xticks(ks)
        chain = modes.get("chain")
        if chain:
            est = chain["acceptance"]["tau_by_depth_estimate"]
            a2.plot(range(len(est)), est, "o--", color=color, alpha=0.6, label=f"{label} chain tau(d) estimate")
        if modes.get("tree"):
            a2.axhline(modes["tree"]["acceptance"]["tau"], color=color, ls=":", label=f"{label} tree tau (measured)")
    if "sweep" in report:
        chains = [r for r in report["sweep"]["configurations"] if r["mode"] == "chain"]
        a2.errorbar(
            [r["steps"] for r in chains],
            [r["tau"] for r in chains],
            yerr=[[r["tau"] - r["tau_interval"][0] for r in chains], [r["tau_interval"][1] - r["tau"] for r in chains]],
            fmt="s-",
            color="black",
            capsize=3,
            label="first head: chain tau(d) measured (sweep)",
        )
    a1.set(xlabel="draft depth k", ylabel="conditional acceptance", ylim=(0, 1.02), title="alpha_k by depth")
    a2.set(xlabel="chain depth d", ylabel="tau (tokens / target pass, bonus incl.)", title="tau by depth")
    if sweep:
        _plot_sweep(axes[2], sweep, report["recommended"])
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def _plot_sweep(ax, sweep: dict, rec: dict) -> None:
    """Measured speedup per configuration with its interval; tied ones filled, the pick starred."""
    rows = sweep["configurations"]
    xs = range(len(rows))
    for x, r in zip(xs, rows):
        lo, hi = r["speedup_interval"]
        color = "tab:green" if r["tied_with_best"] else "tab:gray"
        ax.errorbar(
            [x], [r["speedup"]], yerr=[[r["speedup"] - lo], [hi - r["speedup"]]], fmt="o", color=color, capsize=3
        )
        if r["name"] == rec.get("name"):
            ax.plot([x], [r["speedup"]], "*", color="black", markersize=14, label=f"recommended: {r['name']}")
    ax.axhline(1.0, color="gray", lw=1, ls=":")
    ax.set_xticks(list(xs), [r["name"] for r in rows], rotation=45, ha="right", fontsize=7)
    ax.set(ylabel="speedup vs plain (90% interval)", title="sweep: measured speedup (green = tied with best)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
