"""The `data_levers` key of docs/results-smollm2.json (report_page.py renders its section and figure): what more
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

from benchmarks.smollm2.report_figures import CARRY  # noqa: E402
from benchmarks.smollm2.report_page import write_page  # noqa: E402

# the arms of issue 50's table, in the order the page lists them
ARMS = ("baseline", "synthetic", "lk", "answers", "augment", "chitchat", "mixture")
BENCHES = {"mt_bench": "mt_bench", "gsm8k": "gsm8k", "heldout": "sharegpt"}  # key -> eval folder suffix
# CARRY (report_figures.py, which draws it too): a public bench no corpus here holds and no head trained on
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
    cpu = ((m.get("final_metrics") or {}).get("train_cpu_seconds")) or None  # the training's core-seconds
    return {"run": run, "config": cfg, "tokens": _tokens_seen(run), "epochs": _epochs(run), "reports": reports,
            "cpu_seconds": round(cpu) if cpu else None}  # fmt: skip


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
        "ttt_steps": f["config"].get("ttt_steps"),
        "cpu_seconds": f["cpu_seconds"],
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


def table_rows(data: dict, table: str, arms: dict[str, Path | None]) -> list[dict]:
    """The rows of `table` (data_levers, recipe_levers) with `arms` read or kept. The recipe table's
    baseline is the data table's: another pass over the same data at the same budget, TTT K=3."""
    stored = data.get(table) or []
    if table == "recipe_levers" and not any(r["arm"] == ARMS[0] for r in stored):
        stored = [*stored, *(r for r in data.get("data_levers") or [] if r["arm"] == ARMS[0])]
    return levers_json(arms, ARMS[0], (data.get("published") or {}).get("mt_bench_tau"), stored)


def _counts(row: dict, bench: str = "mt_bench") -> tuple[list[float], list[float]]:
    pp = row[f"{bench}_per_prompt"]
    return pp["emitted"], pp["rounds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--arm", action="append", default=[],
        help="NAME=RUN_DIR (repeat): read this arm from its run folder; NAME alone or not named: its stored row",
    )  # fmt: skip
    ap.add_argument("--results-md", type=Path, default=REPO / "docs" / "results-smollm2.md")
    ap.add_argument(
        "--table", choices=("data_levers", "recipe_levers"), default="data_levers",
        help="recipe_levers (issue 62): arms that change a training setting on the baseline's data, paired "
        "with the data table's baseline (another pass at TTT K=3)",
    )  # fmt: skip
    a = ap.parse_args()
    arms = {}
    for spec in a.arm:
        name, eq, run = spec.partition("=")
        if not name or (eq and not run):
            ap.error(f"--arm {spec!r}: expected NAME=RUN_DIR or NAME")
        arms[name] = Path(run) if run else None
    json_path = a.results_md.with_suffix(".json")
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    try:
        rows = table_rows(data, a.table, arms)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}; nothing was written", file=sys.stderr)
        raise SystemExit(2) from None
    data[a.table] = rows
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    write_page(a.results_md)
    print(f"wrote {a.table} ({len(rows)} arm(s)) into {json_path}")


if __name__ == "__main__":
    main()
