"""Two cores for one training: two threads in one process, or DeepSpeed with one process per core?

    .venv/bin/python benchmarks/stages/both_cores.py --cache runs/smollm2/cache [--steps 40] \
        [--recipe recipes/smollm2-135m/train.yaml] [--out runs/both-cores]

Runs `eagle3 train` from the recipe for --steps optimizer steps three ways on the same cache, one
after another on an otherwise idle machine: one process on one thread (the unit), one process on
two threads, and `--deepspeed zero2 --nproc 2` (one thread each). All run eager: `--compile` is not
supported under DeepSpeed, so the comparison is of the parallelism alone (the compiled unroll's own
gain is measured by train_speed.py). Reports steady tokens/s (the first logged interval is left out)
and each way's ratio to one thread, as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import E3, REPO, Recorder  # noqa: E402

WAYS = {
    "1_thread": ({"OMP_NUM_THREADS": "1"}, []),
    "2_threads": ({"OMP_NUM_THREADS": "2"}, []),
    "deepspeed_2_procs": ({"OMP_NUM_THREADS": "1"}, ["--deepspeed", "zero2", "--nproc", "2"]),
}


def steady_tok_s(run: Path) -> float:
    rows = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().split("\n") if x.strip()]
    rows = [r for r in rows if "tok_per_s" in r][1:]
    return sum(r["tokens"] for r in rows) / sum(r["tokens"] / r["tok_per_s"] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "smollm2-135m" / "train.yaml")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "both-cores")
    args = ap.parse_args()
    rec, result = Recorder(), {}
    for name, (env, flags) in WAYS.items():
        run = args.out / name
        shutil.rmtree(run, ignore_errors=True)  # a measurement, not a resumable run
        cmd = [*E3, "train", "--recipe", args.recipe, "--run", run, "--cache", args.cache]
        cmd += ["--max-steps", args.steps, "--no-compile", "--heldout-samples", 0, "--log-every", 5, *flags]
        rec.sh(cmd, env=env)
        result[name] = {"tok_per_s": round(steady_tok_s(run), 1)}
    unit = result["1_thread"]["tok_per_s"]
    for r in result.values():
        r["vs_1_thread"] = round(r["tok_per_s"] / unit, 3)
    print(json.dumps({"steps": args.steps, "recipe": str(args.recipe), "ways": result}, indent=1))


if __name__ == "__main__":
    main()
