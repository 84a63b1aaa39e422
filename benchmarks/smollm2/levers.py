"""One arm of the data-levers table (issue 50): train from the published head at the arms' budget on
one arm's data, then score it as every arm is scored. Resumable: rerun the same command after a kill
(train resumes from its checkpoint; an eval whose report exists is not run again).

    .venv/bin/python benchmarks/smollm2/levers.py --arm baseline --data corpora/smollm2-135m-sharegpt-vllm
    .venv/bin/python benchmarks/smollm2/levers.py --arm lk --data corpora/smollm2-135m-sharegpt-vllm --loss lk
    .venv/bin/python benchmarks/smollm2/levers.py --arm synthetic --data corpora/smollm2-135m-synthetic-vllm
    .venv/bin/python benchmarks/smollm2/levers.py --arm chitchat --data corpora/smollm2-135m-chitchat-vllm \
        --extra-data corpora/smollm2-135m-chitchat-rest-vllm
    .venv/bin/python benchmarks/smollm2/levers.py --arm augment --data corpora/smollm2-135m-sharegpt-augment-vllm
    .venv/bin/python benchmarks/smollm2/levers.py --arm answers --data corpora/smollm2-135m-sharegpt-answers-vllm

The budget: 1,320 optimizer steps of the online recipe's 1,024-token steps (~1.04M real tokens), lr
1.5e-4 (the long run's continuation rate). One thread each (`--core`: taskset), so two arms run side
by side on a 2-core machine. Then report_levers.py writes the table.

The recipe levers (issue 62) are arms on the baseline's data with one training setting changed,
passed through to `eagle3 train` with --train-flag (the head is the last step's, as every arm's):

    .venv/bin/python benchmarks/smollm2/levers.py --arm ttt5 --data corpora/smollm2-135m-sharegpt-vllm \
        --train-flag=--ttt-steps=5

Arms that change the head's shape (EAGLE-3.1's norms, the draft vocab) cannot start from the published head:
--scratch trains them from nothing at the equal-compute curve's budget (its 1/8 point: the first 1,851
conversations, 1,380 steps, the recipe's lr), named scratch-*, beside the from-scratch baseline `scratch`:

    .venv/bin/python benchmarks/smollm2/levers.py --arm scratch --scratch --data corpora/smollm2-135m-sharegpt-vllm
    .venv/bin/python benchmarks/smollm2/levers.py --arm scratch-nbr --scratch --data corpora/smollm2-135m-sharegpt-vllm \
        --train-flag=--norm-before-residual
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import E3, Recorder  # noqa: E402

STEPS = 1320
SCRATCH = ("--train-samples", 1851, "--max-steps", 1380, "--epochs", 1000000)  # data_scaling_equal_compute's 1/8
PUBLISHED = "models/smollm2-135m-eagle3"
TARGET = "models/smollm2-135m"
# bench, prompts (sharegpt: its held-out split, prompts over 2,048 tokens skipped: some run past the 8k context;
# humaneval: a public bench no corpus here holds, the table's carry-over column, run last so the first three
# of an arm measured before it was added are kept)
EVALS = (("mt_bench", 80), ("gsm8k", 40), ("sharegpt", 40), ("humaneval", 40))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", required=True, help="the arm's name: its run folder is runs/lever-NAME")
    ap.add_argument("--data", required=True, help="the arm's gen-data folder")
    ap.add_argument("--extra-data", action="append", default=[], help="more gen-data folders (train --extra-data)")
    ap.add_argument("--loss", default="ce", choices=("ce", "tv", "lk"))
    ap.add_argument(
        "--train-flag",
        action="append",
        default=[],
        help="one more `eagle3 train` flag, e.g. --train-flag=--ttt-steps=5",
    )
    ap.add_argument("--scratch", action="store_true", help="from no head at the equal-compute curve's 1/8 budget")
    ap.add_argument("--core", type=int, default=None, help="bind to this CPU core (taskset -c)")
    ap.add_argument("--runs", type=Path, default=REPO / "runs")
    a = ap.parse_args()
    run = a.runs / f"lever-{a.arm}"
    if a.scratch != (a.arm == "scratch" or a.arm.startswith("scratch-")):
        ap.error(f"--arm {a.arm}: a --scratch arm is named scratch or scratch-*, and only it (report_levers.py pairs "
                 "it with the from-scratch baseline by its name)")  # fmt: skip
    budget = (
        SCRATCH if a.scratch else ("--init-head", PUBLISHED, "--lr", "1.5e-4", "--epochs", "1", "--max-steps", STEPS)
    )
    pin = ["taskset", "-c", str(a.core)] if a.core is not None else []
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    rec = Recorder()
    if not (run / "head" / "manifest.json").is_file():
        rec.sh([*pin, *E3, "train", "--recipe", "recipes/smollm2-135m/train-online.yaml", "--run", run,
                "--data", a.data, "--target", TARGET, *budget, "--heldout-every", "400", "--loss", a.loss, "--head-from", "last",
                *[x for d in a.extra_data for x in ("--extra-data", d)], *a.train_flag], env=env)  # fmt: skip
    for bench, n in EVALS:
        out = run / f"eval-{bench}"
        if (out / "report.json").is_file():
            continue
        rec.sh([*pin, *E3, "eval", "--head", run / "head", "--target", TARGET, "--bench", bench, "--num-prompts", n,
                "--max-new-tokens", 64, "--depth", 8, "--dtype", "fp32", "--mode", "chain", "--no-generate-baseline",
                "--threads", 1, "--max-prompt-tokens", 2048, "--out", out], env=env)  # fmt: skip
    print(f"arm {a.arm}: {run} (then: benchmarks/smollm2/report_levers.py --arm baseline=... --arm {a.arm}={run})")
    os.sync()


if __name__ == "__main__":
    main()
