"""The `data_levers` and `recipe_levers` keys of docs/results-smollm2.json: what more data (or a training
setting) buys a head that has used up the human prompts, each arm trained from the published head at one
budget (benchmarks/smollm2/levers.py) and scored the same way by `eagle3 eval` (chain d8, fp32, greedy,
64 new tokens) in RUN/eval-mt_bench, eval-gsm8k, eval-sharegpt and, for the carry-over column,
eval-humaneval. Arms at other budgets or eval settings are refused. Each row keeps its per-prompt counts
and eval settings, so an arm measured later is paired against the stored baseline without its run folder:

    .venv/bin/python benchmarks/smollm2/report_levers.py --arm baseline=runs/lever-baseline \\
        --arm synthetic=runs/lever-synthetic ...
    .venv/bin/python benchmarks/smollm2/report_levers.py --arm lk=runs/lever-lk   # the rest from the JSON
    .venv/bin/python benchmarks/smollm2/report_levers.py --table recipe_levers --arm ttt5=runs/lever-ttt5
    .venv/bin/python benchmarks/smollm2/report_levers.py --table recipe_levers --vs-published runs/published-eval-mt_bench

`--vs-published DIR`: the published head's own MT-bench eval, run again with the arms' settings (`eagle3 eval
--head models/smollm2-135m-eagle3 ... --out DIR`, levers.py's eval command); the recipe arms that start from that
head are then paired with it too, side by side on the same prompts: the gain a new head would publish on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import chain_of, counts, paired_delta  # noqa: E402
from benchmarks.smollm2.levers import PUBLISHED  # noqa: E402
from benchmarks.smollm2.publish import metrics  # noqa: E402
from benchmarks.smollm2.report_page import CARRY, PAGE, fail, read_json, rel, save  # noqa: E402

ARMS = ("baseline", "synthetic", "lk", "answers", "augment", "chitchat", "mixture")  # the page's order
BENCHES = {"mt_bench": "mt_bench", "gsm8k": "gsm8k", "heldout": "sharegpt", CARRY: CARRY}  # key: eval folder
# the paired gains: MT-bench's, and CARRY's (a public bench no corpus here holds and no head trained on: does
# an MT-bench gain carry over? Its eval came after the first arms, so a row may lack it, "-" on the page)
DELTAS = {"mt_bench": ("delta_vs_baseline", "delta_interval"), CARRY: (f"{CARRY}_delta", f"{CARRY}_delta_interval")}
SAME_EVAL = ("bench", "num_prompts", "max_new_tokens", "depth", "mode", "temperature")


def arm_row(name: str, run: Path, start_tau: float | None) -> dict:
    """One arm's row, from its run folder, with what pairing and the refusals need (per-prompt counts, the
    evals' settings, the budget), so a later report pairs new arms against it when its run folder is gone."""
    m = json.loads((run / "train" / "manifest.json").read_text())
    cfg, reports = m.get("config") or {}, {}
    for key, suffix in BENCHES.items():
        if (rep := read_json(run / f"eval-{suffix}" / "report.json")) is not None:
            reports[key] = rep
        elif key != CARRY:
            raise FileNotFoundError(f"{run}/eval-{suffix}/report.json is missing: run the arm's evals "
                                    "(benchmarks/smollm2/levers.py)")  # fmt: skip
    chain = {k: chain_of(r) for k, r in reports.items()}
    tau = chain["mt_bench"]["acceptance"]["tau"]
    if (tokens := m.get("tokens_seen")) is None:
        raise KeyError(f"{run}/train/manifest.json records no tokens_seen")
    cpu = (m.get("final_metrics") or {}).get("train_cpu_seconds")  # the training's core-seconds
    logged = metrics(run) or [{}]
    # epochs begun: more than 1 when its corpus was smaller than the budget, so not every token was new
    epochs = 1 + int(logged[-1].get("epoch", 0))
    # a CPU-seconds budget (equal compute): its steps are what the budget bought; its CPU seconds at each logged
    # step let a step-budgeted arm of the same K that predates CPU seconds be costed on the same batches
    budget = cfg.get("time_budget_s") if cfg.get("time_clock") == "cpu" else None
    cpu_by_step = {str(r["step"]): round(r["train_cpu_seconds"]) for r in logged if r.get("train_cpu_seconds")}
    per_prompt = {k: counts(c) for k, c in chain.items() if k in DELTAS}
    taus = {k: round(c["acceptance"]["tau"], 4) for k, c in chain.items()}
    return {"arm": name, "run": str(run),
            "data": " + ".join(rel(d or "?") for d in [cfg.get("data"), *(cfg.get("extra_data") or ())]),
            "loss": cfg.get("loss"), "ttt_steps": cfg.get("ttt_steps"), "draft_vocab_size": cfg.get("draft_vocab_size"),
            **{n: True for n in ("norm_before_fc", "norm_before_residual") if cfg.get(n)}, "cpu_seconds": round(cpu) if cpu else None,
            "new_tokens": int(tokens), "epochs": epochs, "steps": cfg.get("max_steps") or logged[-1].get("step"),
            **({"cpu_budget_s": budget, "cpu_seconds_by_step": cpu_by_step} if budget else {}),
            "machine": (m.get("machine") or {}).get("cpu"),  # CPU seconds compare only on one machine
            "mt_bench_tau": taus["mt_bench"],
            "mt_bench_tau_interval": [round(x, 4) for x in chain["mt_bench"]["acceptance"]["tau_interval"]],
            "tau_gain_per_million_tokens": None if start_tau is None else round((tau - start_tau) / (tokens / 1e6), 4),
            "heldout_tau": taus["heldout"], "gsm8k_tau": taus["gsm8k"],
            "mismatches": sum(c.get("lossless", {}).get("mismatches", 0) for c in chain.values()),
            "eval_settings": {k: {s: r.get(s) for s in SAME_EVAL} for k, r in reports.items()},
            "mt_bench_per_prompt": per_prompt["mt_bench"],
            # alpha at each draft depth (accepted / attempted there): where deeper TTT should show, if anywhere
            "mt_bench_alpha_k": [round(x["alpha"], 4) if x["attempts"] else None
                                 for x in chain["mt_bench"]["acceptance"]["per_depth"]],
            **({f"{CARRY}_tau": taus[CARRY], f"{CARRY}_per_prompt": per_prompt[CARRY]} if CARRY in chain
               else {})}  # fmt: skip


def levers_json(arms: dict[str, Path | None], baseline: str, start_tau: float | None, stored=()) -> list[dict]:
    """The table's rows: arms named with a run folder are read from it; an arm named without one (and every
    stored arm not named) keeps its stored row. All are held to the baseline's budget and evals, and paired
    with it by prompt."""
    rows = {r["arm"]: r for r in stored}
    for name, run in arms.items():
        if run is not None:
            rows[name] = arm_row(name, run, start_tau)
        elif name not in rows:
            raise KeyError(f"arm {name!r} has no run folder and no stored row: name it as {name}=RUN_DIR")
    if (base := rows.get(baseline)) is None:
        raise KeyError(f"the baseline arm {baseline!r} is neither named nor stored: add --arm {baseline}=RUN_DIR")
    out = []
    for n in [a for a in ARMS if a in rows] + [a for a in rows if a not in ARMS]:
        r = rows[n]
        if "mt_bench_per_prompt" not in r:
            raise KeyError(f"the stored row of {n!r} predates per-prompt counts: name it again as {n}=RUN_DIR")
        if r["steps"] != base["steps"] and not r.get("cpu_budget_s"):  # equal steps, or a declared CPU budget
            raise ValueError(f"the arms trained different budgets (--max-steps): {n} {r['steps']}, {baseline} "
                             f"{base['steps']} (an arm at equal CPU seconds trains --time-budget-s --time-clock cpu)")  # fmt: skip
        for key in BENCHES:  # CARRY not measured on one side: no carry-over pair, the page shows "-"
            mine, theirs = r["eval_settings"].get(key), base["eval_settings"].get(key)
            if mine != theirs and not (key == CARRY and None in (mine, theirs)):
                raise ValueError(f"{n}'s {key} eval differs from {baseline}'s: {mine}")
        row = {k: v for k, v in r.items() if not k.startswith(f"{CARRY}_delta")}
        for bench, (value, interval) in DELTAS.items():
            if f"{bench}_per_prompt" in r and f"{bench}_per_prompt" in base:
                row[value], row[interval] = paired_delta(r[f"{bench}_per_prompt"], base[f"{bench}_per_prompt"])
        out.append(row)
    return out


def table_rows(data: dict, table: str, arms: dict[str, Path | None]) -> list[dict]:
    """The rows of `table` (data_levers, recipe_levers) with `arms` read or kept. The recipe table's
    baseline is the data table's: another pass over the same data at the same budget, TTT K=3; its arms
    named scratch-* (levers.py --scratch: another shape, from no head) pair with the from-scratch `scratch`."""
    stored, start = data.get(table) or [], (data.get("published") or {}).get("mt_bench_tau")
    if table == "data_levers":
        return levers_json(arms, ARMS[0], start, stored)
    if not any(r["arm"] == ARMS[0] for r in stored):
        stored = [*stored, *(r for r in data.get("data_levers") or [] if r["arm"] == ARMS[0])]
    rows = []
    for base, tau in ((ARMS[0], start), ("scratch", None)):
        named = {n: r for n, r in arms.items() if n.startswith("scratch") == (base == "scratch")}
        kept = [r for r in stored if r["arm"].startswith("scratch") == (base == "scratch")]
        rows += levers_json(named, base, tau, kept) if named or kept else []
    _costs(rows, data)
    if pub := data.get("recipe_levers_vs_published"):
        _vs_published(rows, pub)
    return rows


def published_eval(path: Path) -> dict:
    """The published head's MT-bench eval in PATH (eval's report.json): its settings, tau and per-prompt counts,
    kept in the JSON so a later report pairs new arms with it when PATH is gone."""
    if (rep := read_json(path / "report.json")) is None:
        raise FileNotFoundError(f"{path}/report.json is missing: run the published head's MT-bench eval there with "
                                "the arms' settings (levers.py's `eagle3 eval` with --head models/smollm2-135m-eagle3)")  # fmt: skip
    head = next(iter(rep.get("heads") or {}), None)
    if rep.get("bench") != "mt_bench" or head != PUBLISHED:
        raise ValueError(f"{path} is {rep.get('bench')}'s eval of {head}, expected MT-bench's of {PUBLISHED}")
    chain = chain_of(rep)
    return {"eval": rel(path), "head": head, "mt_bench_tau": round(chain["acceptance"]["tau"], 4),
            "eval_settings": {s: rep.get(s) for s in SAME_EVAL}, "mt_bench_per_prompt": counts(chain)}  # fmt: skip


def _vs_published(rows: list[dict], pub: dict) -> None:
    """Each arm that starts from the published head (not scratch-*) paired with that head's own eval."""
    for r in (r for r in rows if not r["arm"].startswith("scratch")):
        if r["eval_settings"]["mt_bench"] != pub["eval_settings"]:
            raise ValueError(f"the published head's eval ({pub['eval']}) differs from {r['arm']}'s MT-bench eval: "
                             f"{pub['eval_settings']} against {r['eval_settings']['mt_bench']}")  # fmt: skip
        r["delta_vs_published"], r["delta_vs_published_interval"] = paired_delta(
            r["mt_bench_per_prompt"], pub["mt_bench_per_prompt"]
        )


def _costs(rows: list[dict], data: dict) -> None:
    """The baseline's CPU seconds where its run predates them: an equal-CPU arm's of its K at its step (the same
    batches). Each row's draft step in target-token times, as round_cost.py measured its draft vocab's (none where
    it was not measured)."""
    base, k = rows[0], lambda r: r.get("ttt_steps") or 3  # the baseline predates `ttt_steps`: K=3
    for r in [r for r in rows[1:] if k(r) == k(base) and not r["arm"].startswith("scratch")]:
        if base.get("cpu_seconds") is None and (cpu := r.get("cpu_seconds_by_step", {}).get(str(base["steps"]))):
            base["cpu_seconds"], base["cpu_seconds_from"] = cpu, f"{r['arm']} at step {base['steps']:,} (same batches)"
    steps = (data.get("draft_step_cost") or {}).get("by_draft_vocab") or {}  # round_cost.py --draft-step-vocabs
    for r in rows:  # one layer in every arm (norm_before_fc's one more norm not measured apart); a row predating
        # `draft_vocab_size` trained the recipe's 16,384
        r["draft_step_cost"] = (steps.get(str(r.get("draft_vocab_size") or 16384)) or {}).get("target_tokens")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", action="append", default=[],
                    help="NAME=RUN_DIR (repeat): read this arm from its run folder; NAME alone or not named: its "
                    "stored row")  # fmt: skip
    ap.add_argument("--results-md", type=Path, default=PAGE)
    ap.add_argument("--vs-published", type=Path, default=None, metavar="DIR",
                    help="the published head's MT-bench eval folder: pair the recipe arms from it with it too")  # fmt: skip
    ap.add_argument("--table", choices=("data_levers", "recipe_levers"), default="data_levers",
                    help="recipe_levers: arms that change a training setting on the baseline's data, paired with the "
                    "data table's baseline (another pass at TTT K=3)")  # fmt: skip
    a = ap.parse_args()
    arms = {}
    for spec in a.arm:
        name, eq, run = spec.partition("=")
        if not name or (eq and not run):
            ap.error(f"--arm {spec!r}: expected NAME=RUN_DIR or NAME")
        arms[name] = Path(run) if run else None
    data = read_json(a.results_md.with_suffix(".json")) or {}
    try:
        if a.vs_published is not None:
            if a.table != "recipe_levers":
                ap.error("--vs-published pairs the recipe arms: give it with --table recipe_levers")
            data["recipe_levers_vs_published"] = published_eval(a.vs_published)
        data[a.table] = table_rows(data, a.table, arms)
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(str(e))
    save(a.results_md, data)
    print(f"wrote {a.table} ({len(data[a.table])} arm(s)) into {a.results_md.with_suffix('.json')}")
