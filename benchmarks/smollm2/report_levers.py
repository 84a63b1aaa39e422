"""The `data_levers` key of docs/results-smollm2.json, its page section and figure (issue 50): what more
data from the prompts we have, or from prompts the target writes, buys a head that has used up the human
prompts, each arm trained from the published head at one budget and scored the same way.

An arm is a train run folder (`eagle3 train ... --init-head models/smollm2-135m-eagle3 --max-steps N`)
holding `eval-mt_bench`, `eval-gsm8k`, `eval-sharegpt` and, for the carry-over column, `eval-humaneval`
(eagle3 eval, chain d8, fp32, greedy, 64 new tokens; the arms' script is benchmarks/smollm2/levers.py). Every arm must have run the baseline's
steps and evals (refused otherwise: rows at other budgets or settings do not stand in one table).
Each row keeps its MT-bench per-prompt counts and eval settings in the JSON, so an arm measured in a later
session is paired against the stored baseline without the baseline's run folder:

    .venv/bin/python benchmarks/smollm2/report_levers.py --arm baseline=runs/lever-baseline \\
        --arm synthetic=runs/lever-synthetic ...
    .venv/bin/python benchmarks/smollm2/report_levers.py --arm lk=runs/lever-lk   # the rest from the JSON

The gain over the baseline is paired by prompt (the same 80 MT-bench first turns): a percentile interval
of tau(arm) - tau(baseline) over prompts resampled with replacement. Nothing here trains or evaluates.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.smollm2.report_bars import CARRY, bars_json, rewrite_bars  # noqa: E402

# the arms of issue 50's table, in the order the page lists them
ARMS = ("baseline", "synthetic", "lk", "answers", "augment", "chitchat", "mixture")
HEADING = "## Data levers: what more data buys a head that has used up the human prompts"
BEFORE = "## Data scaling"
BENCHES = {"mt_bench": "mt_bench", "gsm8k": "gsm8k", "heldout": "sharegpt"}  # key -> eval folder suffix
# CARRY (report_bars.py, which issue 50's bars share): a public bench no corpus here holds and no head trained on
# (gen-data keeps HumanEval out by text): does an MT-bench gain carry over? Its eval came after the first arms,
# so a row may lack it (then "-" on the page).
SAME_EVAL = ("bench", "num_prompts", "max_new_tokens", "depth", "mode", "temperature")


def _chain(report: dict) -> dict:
    """The chain decoder's numbers of the report's one head (eval's report.json: heads.NAME.chain)."""
    heads = report["heads"]
    if len(heads) != 1:
        raise ValueError(f"an arm's eval holds one head, this one {len(heads)}")
    return next(iter(heads.values()))["chain"]


def _per_prompt(report: dict) -> tuple[list[float], list[float]]:
    """(tokens emitted, rounds) per prompt of the chain decoder: tau = sum / sum."""
    rows = _chain(report)["per_prompt"]
    return [r["accepted"] + r["rounds"] for r in rows], [r["rounds"] for r in rows]


def paired_delta(a, b, samples: int = 2000, level: float = 0.9, seed: int = 0) -> dict:
    """tau(a) - tau(b) over the same prompts, with a percentile interval of prompts resampled together."""
    (an, ad), (bn, bd) = a, b
    n = len(an)
    if n == 0 or len(bn) != n:
        raise ValueError(f"paired prompts expected, got {n} and {len(bn)}")

    def stat(idx) -> float:
        return sum(an[i] for i in idx) / sum(ad[i] for i in idx) - sum(bn[i] for i in idx) / sum(bd[i] for i in idx)

    rng = random.Random(seed)
    values = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(samples))
    lo, hi = int((1 - level) / 2 * (samples - 1)), int((1 + level) / 2 * (samples - 1))
    return {"value": stat(range(n)), "low": values[lo], "high": values[hi], "level": level, "prompts": n}


def _eval_settings(report: dict) -> dict:
    return {k: report.get(k) for k in SAME_EVAL}


def _tokens_seen(run: Path) -> int:
    m = json.loads((run / "train" / "manifest.json").read_text())
    for where in (m, m.get("summary") or {}, m.get("counts") or {}):
        if "tokens_seen" in where:
            return int(where["tokens_seen"])
    raise KeyError(f"{run}/train/manifest.json records no tokens_seen")


def _epochs(run: Path) -> int:
    """Epochs the arm's training began (1: every token it trained on was new to it; more: its corpus was
    smaller than the budget and it repeated data, so its tokens are not all new)."""
    last = None
    with open(run / "train" / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                last = line
    return 1 + int(json.loads(last).get("epoch", 0)) if last else 1


def arm_facts(run: Path) -> dict:
    m = json.loads((run / "train" / "manifest.json").read_text())
    cfg = m.get("config") or {}
    reports = {}
    for key, suffix in BENCHES.items():
        p = run / f"eval-{suffix}" / "report.json"
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: run the arm's evals (benchmarks/smollm2/levers.py)")
        reports[key] = json.loads(p.read_text())
    carry = run / f"eval-{CARRY}" / "report.json"
    if carry.is_file():
        reports[CARRY] = json.loads(carry.read_text())
    return {"run": run, "config": cfg, "tokens": _tokens_seen(run), "epochs": _epochs(run), "reports": reports}


def _in_repo(folder: str | None) -> str:
    """A data folder as the page names it: relative to the repository when it is inside it."""
    p = Path(folder or "?")
    return str(p.relative_to(REPO)) if p.is_absolute() and p.is_relative_to(REPO) else str(p)


def arm_row(name: str, run: Path, start_tau: float | None) -> dict:
    """One arm's row, from its run folder. It keeps what pairing and the refusals need (the MT-bench
    per-prompt counts, the evals' settings, the budget), so a later report pairs new arms against it
    from the JSON alone when its run folder is gone (runs/ does not travel between machines)."""
    f = arm_facts(run)
    mt = _chain(f["reports"]["mt_bench"])["acceptance"]
    emitted, rounds = _per_prompt(f["reports"]["mt_bench"])
    tau = mt["tau"]
    carry = {}
    if CARRY in f["reports"]:
        c_emitted, c_rounds = _per_prompt(f["reports"][CARRY])
        carry = {
            f"{CARRY}_tau": round(_chain(f["reports"][CARRY])["acceptance"]["tau"], 4),
            f"{CARRY}_per_prompt": {"emitted": c_emitted, "rounds": c_rounds},
        }
    return {
        "arm": name,
        "run": str(run),
        "data": " + ".join(_in_repo(d) for d in [f["config"].get("data"), *(f["config"].get("extra_data") or ())]),
        "loss": f["config"].get("loss"),
        "new_tokens": f["tokens"],
        "epochs": f["epochs"],
        "steps": f["config"].get("max_steps"),
        "mt_bench_tau": round(tau, 4),
        "mt_bench_tau_interval": [round(x, 4) for x in mt["tau_interval"]],
        "tau_gain_per_million_tokens": (
            round((tau - start_tau) / (f["tokens"] / 1e6), 4) if start_tau is not None else None
        ),
        "heldout_tau": round(_chain(f["reports"]["heldout"])["acceptance"]["tau"], 4),
        "gsm8k_tau": round(_chain(f["reports"]["gsm8k"])["acceptance"]["tau"], 4),
        "mismatches": sum(_chain(r).get("lossless", {}).get("mismatches", 0) for r in f["reports"].values()),
        "eval_settings": {k: _eval_settings(r) for k, r in f["reports"].items()},
        "mt_bench_per_prompt": {"emitted": emitted, "rounds": rounds},
        **carry,
    }


def levers_json(
    arms: dict[str, Path | None], baseline: str, start_tau: float | None, stored: list[dict] = ()
) -> list[dict]:
    """The table's rows: arms named with a run folder are read from it; an arm named without one (and
    every stored arm not named) keeps its stored row. All are held to the baseline's budget and evals,
    and paired with it by prompt."""
    kept = {r["arm"]: r for r in stored}
    rows = dict(kept)
    for name, run in arms.items():
        if run is None:
            if name not in kept:
                raise KeyError(f"arm {name!r} has no run folder and no stored row: name it as {name}=RUN_DIR")
            continue
        rows[name] = arm_row(name, run, start_tau)
    if baseline not in rows:
        raise KeyError(f"the baseline arm {baseline!r} is neither named nor stored: add --arm {baseline}=RUN_DIR")
    base = rows[baseline]
    for n, r in rows.items():
        if "mt_bench_per_prompt" not in r:
            raise KeyError(f"the stored row of {n!r} predates per-prompt counts: name it again as {n}=RUN_DIR")
        if r["steps"] != base["steps"]:
            raise ValueError(
                f"the arms trained different budgets (--max-steps): {n} {r['steps']}, {baseline} {base['steps']}"
            )
        for key in (*BENCHES, CARRY):
            mine, theirs = r["eval_settings"].get(key), base["eval_settings"].get(key)
            if key == CARRY and (mine is None or theirs is None):
                continue  # not measured on one side: no carry-over pair, the page shows "-"
            if mine != theirs:
                raise ValueError(f"{n}'s {key} eval differs from {baseline}'s: {mine}")
    order = [a for a in ARMS if a in rows] + [a for a in rows if a not in ARMS]
    out = []
    for n in order:
        r = rows[n]
        d = paired_delta(_counts(r), _counts(base))
        row = {
            **{k: v for k, v in r.items() if not k.startswith(f"{CARRY}_delta")},
            "delta_vs_baseline": round(d["value"], 4),
            "delta_interval": [round(d["low"], 4), round(d["high"], 4)],
        }
        if f"{CARRY}_per_prompt" in r and f"{CARRY}_per_prompt" in base:
            c = paired_delta(_counts(r, CARRY), _counts(base, CARRY))
            row[f"{CARRY}_delta"] = round(c["value"], 4)
            row[f"{CARRY}_delta_interval"] = [round(c["low"], 4), round(c["high"], 4)]
        out.append(row)
    return out


def _counts(row: dict, bench: str = "mt_bench") -> tuple[list[float], list[float]]:
    pp = row[f"{bench}_per_prompt"]
    return pp["emitted"], pp["rounds"]


def section(rows: list[dict], start_tau: float | None, figure: str) -> list[str]:
    lines = [
        HEADING,
        "",
        "Every arm starts from the published head and trains the same number of steps (1,024-token steps, the "
        "online recipe, lr 1.5e-4) on its own data; each is scored by `eagle3 eval` (chain d8, fp32, greedy, 64 "
        "new tokens) on MT-bench's 80 first turns, the ShareGPT held-out split (its first 40 prompts of at most "
        "2,048 tokens), GSM8K test (40) and HumanEval (40: a public bench no corpus here holds, code prompts no "
        "head trained on, so an MT-bench gain that does not carry over shows there). Each gain "
        "is paired by prompt against the baseline (another pass over the ShareGPT corpus the head has seen), "
        "with a 90% interval; tau per million new tokens is against the published head's MT-bench tau"
        + (f" ({start_tau:.3f})." if start_tau is not None else "."),
        "",
        "| arm | data | loss | tokens trained | MT-bench tau [90%] | vs baseline [90%] | tau / M tokens | held-out tau "
        "| GSM8K tau | HumanEval tau (vs baseline [90%]) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        iv, d = r["mt_bench_tau_interval"], r["delta_interval"]
        per_m = r["tau_gain_per_million_tokens"]
        lines.append(
            f"| {r['arm']} | `{r['data']}` | {r['loss']} | {r['new_tokens']:,}{_repeats(r)} | {r['mt_bench_tau']:.3f} "
            f"[{iv[0]:.2f}, {iv[1]:.2f}] | {r['delta_vs_baseline']:+.3f} [{d[0]:+.3f}, {d[1]:+.3f}] | "
            f"{'-' if per_m is None else f'{per_m:+.3f}'} | {r['heldout_tau']:.3f} | {r['gsm8k_tau']:.3f} | "
            f"{_carry_cell(r)} |"
        )
    if len(rows) < len(ARMS):
        left = [a for a in ARMS if a not in {r["arm"] for r in rows}]
        lines += ["", f"Measured so far: {len(rows)} of {len(ARMS)} arms; still to run: {', '.join(left)}."]
    arms = " ".join(f"--arm {r['arm']}={r['run']}" for r in rows)
    lines += [
        "",
        "Each arm: `.venv/bin/python benchmarks/smollm2/levers.py --arm NAME --data FOLDER [--loss lk] --core N` "
        f"(train, then the four evals); this table: `.venv/bin/python benchmarks/smollm2/report_levers.py {arms}`.",
        "",
        f"![MT-bench tau by lever beside the published head, and each lever's paired gain over the baseline]({figure})",
        "",
    ]
    return lines


def _repeats(r: dict) -> str:
    """A row whose corpus was smaller than the budget says so: its tokens were not all new."""
    return f" ({r['epochs']} epochs: repeated)" if r.get("epochs", 1) > 1 else ""


def _carry_cell(r: dict) -> str:
    if f"{CARRY}_tau" not in r:
        return "-"
    if f"{CARRY}_delta" not in r:
        return f"{r[f'{CARRY}_tau']:.3f}"
    d = r[f"{CARRY}_delta_interval"]
    return f"{r[f'{CARRY}_tau']:.3f} ({r[f'{CARRY}_delta']:+.3f} [{d[0]:+.3f}, {d[1]:+.3f}])"


def plot(rows: list[dict], path: Path, start_tau: float | None) -> None:
    """Left: each arm's MT-bench tau with its 90% interval, beside the published head it started from and the
    baseline. Right: the gain over the baseline paired by prompt (the table's), on MT-bench and, where both
    measured it, on the carry-over bench: unpaired intervals overlap where the paired ones do not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    from benchmarks.smollm2.report_data import replace_section

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--arm", action="append", default=[],
        help="NAME=RUN_DIR (repeat): read this arm from its run folder; NAME alone or not named: its stored row",
    )  # fmt: skip
    ap.add_argument("--results-md", type=Path, default=REPO / "docs" / "results-smollm2.md")
    a = ap.parse_args()
    arms = {}
    for spec in a.arm:
        name, eq, run = spec.partition("=")
        if not name or (eq and not run):
            ap.error(f"--arm {spec!r}: expected NAME=RUN_DIR or NAME")
        arms[name] = Path(run) if run else None
    json_path = a.results_md.with_suffix(".json")
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    start = (data.get("published") or {}).get("mt_bench_tau")
    try:
        rows = levers_json(arms, ARMS[0], start, data.get("data_levers") or [])
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}; nothing was written", file=sys.stderr)
        raise SystemExit(2) from None
    data["data_levers"] = rows
    data.update(bars_json(data))
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    figure = a.results_md.parent / "results-data-levers.png"
    plot(rows, figure, start)
    lines = section(rows, start, figure.name)
    md = a.results_md.read_text() if a.results_md.exists() else ""
    a.results_md.write_text(rewrite_bars(replace_section(md, lines, BEFORE, HEADING), data))
    print("\n".join(lines))
    print(f"wrote data_levers ({len(rows)} arm(s)) into {json_path}, its section of {a.results_md} and {figure}")


if __name__ == "__main__":
    main()
