"""The recipe choices the anchors offer, side by side, at one fixed CPU budget (issue 22).

    .venv/bin/python benchmarks/smollm2/recipes.py --cache runs/smollm2/cache [--budget-s 600] \
        [--only baseline,k3,muon] [--eval-prompts 20] [--out runs/smollm2-recipes]

Every row is `eagle3 train --recipe recipes/smollm2-135m/train.yaml` with the recipe as it was
before these rows (BASELINE below: K=7, 8k-token steps, lr 1e-3) and a few flags changed, and
`--time-budget-s B`: the same number of CPU seconds of training on one thread (core-seconds;
the step that compiles the TTT unroll is not counted), on the same cache, with the same held-out
conversations. Rows report the held-out chain tau at depth 8 at the end of the budget (the
learning curve, from the TTT unroll) and, with --eval-prompts N, `eagle3 eval`'s greedy chain tau
on the first N MT-bench questions (fp32 target). Each run resumes where it stopped; a finished
row is not rerun. Writes OUT/recipes.json and prints the table (docs/results-train.md holds it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import E3, REPO, Recorder  # noqa: E402
from benchmarks.smollm2.run_bench import eval_cmd  # noqa: E402

RECIPE = REPO / "recipes" / "smollm2-135m" / "train.yaml"

# The rows were measured against the recipe as it stood before them (issue 22); that recipe is
# spelled out here so the rows stay what they were when recipes/smollm2-135m/train.yaml moves on.
BASELINE = [
    "--ttt-steps",
    "7",
    "--token-budget",
    "8192",
    "--lr",
    "1e-3",
    "--init",
    "random",
    "--max-attention",
    "4194304",
]

# recipes/smollm2-135m/train.yaml's choices over BASELINE (the `chosen` row)
CHOSEN = ["--ttt-steps", "3", "--token-budget", "1024", "--lr", "5e-4", "--init", "soft"]

# name -> (what it changes, flags over BASELINE; a later flag wins).
ROWS: dict[str, tuple[str, list[str]]] = {
    "baseline": ("today's recipe: K=7, 0.8^k, 8k tokens/step, AdamW lr 1e-3, CE, target lm_head", []),
    "tok2k": ("2k tokens per step (lr 1e-3)", ["--token-budget", "2048"]),
    "tok1k": ("1k tokens per step (lr 5e-4)", ["--token-budget", "1024", "--lr", "5e-4"]),
    "k1": ("TTT K=1", ["--ttt-steps", "1"]),
    "k3": ("TTT K=3", ["--ttt-steps", "3"]),
    "k5": ("TTT K=5", ["--ttt-steps", "5"]),
    "k3_w1": ("TTT K=3, equal step weights", ["--ttt-steps", "3", "--step-weight", "1.0"]),
    "muon": ("Muon on 2-D weights (AdamW on the rest)", ["--optimizer", "muon"]),
    "head_frozen": ("target lm_head rows frozen", ["--lm-head", "frozen"]),
    "head_fresh": ("fresh lm_head", ["--lm-head", "fresh"]),
    "init_soft": ("soft init (first loss near ln V)", ["--init", "soft"]),
    "init_pass_top": ("pass-top init", ["--init", "pass-top"]),
    "loss_tv": ("total-variation loss", ["--loss", "tv"]),
    "noise": ("feature noise 0.05", ["--feature-noise", "0.05"]),
    "vocab8k": ("draft vocab 8k (the cache's 8,192 most frequent tokens)", ["--draft-vocab-size", "8192"]),
    # the screen's winners together
    "k1_tok1k": (
        "TTT K=1 and 1k tokens per step (lr 5e-4)",
        ["--ttt-steps", "1", "--token-budget", "1024", "--lr", "5e-4"],
    ),
    "k3_tok1k": (
        "TTT K=3 and 1k tokens per step (lr 5e-4)",
        ["--ttt-steps", "3", "--token-budget", "1024", "--lr", "5e-4"],
    ),
    "k3_tok1k_vocab8k": (
        "TTT K=3, 1k tokens per step (lr 5e-4), draft vocab 8k",
        ["--ttt-steps", "3", "--token-budget", "1024", "--lr", "5e-4", "--draft-vocab-size", "8192"],
    ),
    # the recipe this table chose (recipes/smollm2-135m/train.yaml as it stands)
    "chosen": ("the chosen recipe: K=3, 1k tokens per step, lr 5e-4, soft init", CHOSEN),
    "chosen_vocab8k": (
        "the chosen recipe with draft vocab 8k",
        [*CHOSEN, "--draft-vocab-size", "8192"],
    ),
    # EAGLE-3.1's norms (issue 31), each over the chosen recipe
    "chosen_norm_fc": (
        "the chosen recipe with norm_before_fc (EAGLE-3.1: RMSNorm over the concatenated aux features)",
        [*CHOSEN, "--norm-before-fc"],
    ),
    "chosen_norm_residual": (
        "the chosen recipe with norm_before_residual (EAGLE-3.1: the layer's residual is hidden_norm(h))",
        [*CHOSEN, "--norm-before-residual"],
    ),
    "chosen_norm_both": (
        "the chosen recipe with both EAGLE-3.1 norms",
        [*CHOSEN, "--norm-before-fc", "--norm-before-residual"],
    ),
}


def train_args(cache: Path, run: Path, budget: float, flags: list[str], every: tuple[int, int] = (10, 20)) -> list:
    """`every`: (save, held-out) intervals in steps; 1k-token rows take ~10x the steps of 8k ones."""
    return [
        *E3,
        "train",
        "--recipe",
        RECIPE,
        "--run",
        run,
        "--cache",
        cache,
        "--time-budget-s",
        str(budget),
        "--time-clock",
        "cpu",
        "--max-steps",
        "none",
        "--save-every",
        str(every[0]),
        "--log-every",
        "5",
        "--heldout-every",
        str(every[1]),
        *BASELINE,
        *flags,
    ]


def heldout(run: Path) -> dict:
    lines = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().split("\n") if x.strip()]
    points = [m for m in lines if "heldout_tau" in m]
    last = points[-1]
    return {
        "heldout_tau": last["heldout_tau"],
        "heldout_alpha_k": last["heldout_alpha_k"],
        "steps": last["step"],
        "tokens": last["tokens_seen"],
        "cpu_seconds": last.get("train_cpu_seconds"),
        "first_loss": lines[0]["loss_k"][0],
        "curve": [
            {
                "tokens": m["tokens_seen"],
                "steps": m["step"],
                "seconds": m.get("train_seconds"),
                "heldout_tau": m["heldout_tau"],
            }
            for m in points
        ],
    }


def eval_tau(rec: Recorder, run: Path, prompts: int) -> float | None:
    out = run / "eval-mt_bench"
    if not (out / "report.json").exists():
        opts = argparse.Namespace(max_new_tokens=64, threads=1)
        rec.sh(eval_cmd(run, out, "mt_bench", prompts, opts, "--mode", "chain", "--no-generate-baseline"))
    heads = json.loads((out / "report.json").read_text())["heads"]
    return float(next(iter(heads.values()))["chain"]["acceptance"]["tau"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "smollm2-recipes")
    ap.add_argument("--budget-s", type=float, default=600.0, help="CPU seconds of training per row")
    ap.add_argument("--only", default=",".join(ROWS), help="comma-separated row names")
    ap.add_argument("--eval-prompts", type=int, default=0, help="MT-bench prompts for eval tau (0: skip)")
    ap.add_argument("--also", type=Path, nargs="*", default=[], help="other --out folders whose rows join the table")
    ap.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    ap.add_argument("--heldout-every", type=int, default=20, help="steps between learning-curve points")
    ap.add_argument("--base", default="baseline", help="the row the others are divided by (vs NAME)")
    ap.add_argument("--table", action="store_true", help="print the table of what is measured; train nothing")
    args = ap.parse_args()
    rec, results = Recorder(), {}
    path = args.out / "recipes.json"
    if path.exists():
        results = json.loads(path.read_text()).get("rows", {})
        if args.table:
            args.budget_s = json.loads(path.read_text())["budget_cpu_s"]
    for name in [] if args.table else args.only.split(","):
        what, flags = ROWS[name]
        run = args.out / name
        every = (args.save_every, args.heldout_every)
        rec.sh(train_args(args.cache, run, args.budget_s, flags, every), env={"OMP_NUM_THREADS": "1"})
        row = {"what": what, "flags": " ".join(flags), **heldout(run)}
        if args.eval_prompts:
            row["eval_tau"] = eval_tau(rec, run, args.eval_prompts)
        results[name] = row
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"budget_cpu_s": args.budget_s, "cache": str(args.cache), "rows": results}, indent=1)
        )
    for other in args.also:
        results.update(json.loads((other / "recipes.json").read_text()).get("rows", {}))
    for folder in (args.out, *args.also):  # evals run since (eval_tau reads a finished report)
        for name, row in results.items():
            if (folder / name / "eval-mt_bench" / "report.json").exists():
                row["eval_tau"] = eval_tau(rec, folder / name, args.eval_prompts)
    base = results.get(args.base, {}).get("heldout_tau")
    print(f"\nbudget {args.budget_s:.0f} CPU s per row; held-out chain tau at depth 8")
    print(f"| row | change | first loss | steps | tokens | held-out tau | vs {args.base} | eval tau (MT-bench) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        rel = f"{r['heldout_tau'] / base:.2f}x" if base else "-"
        ev = f"{r['eval_tau']:.3f}" if r.get("eval_tau") else "-"
        print(
            f"| {name} | {r['what']} | {r['first_loss']:.2f} | {r['steps']} | {r['tokens']:,} | "
            f"{r['heldout_tau']:.3f} | {rel} | {ev} |"
        )


if __name__ == "__main__":
    main()
