"""Publish a head trained across working sessions: measure it as the results page measures its
published head, write the page's published-head keys, and export it.

    .venv/bin/python benchmarks/smollm2/publish.py --sessions runs/long-s1 runs/long-s2 runs/long-s3
    .venv/bin/python benchmarks/smollm2/publish.py --continue --sessions runs/long-s4   # s1-s3 from the page

A long run that spans sessions is several run folders, each started from the last one's head
(`eagle3 train --init-head ... --skip-samples ...`, docs/train.md). The last session's head is the
one published. Run folders do not outlive a machine: `--continue` keeps the sessions an earlier
publish wrote on the page and adds the ones named, which must carry on where the page's last stops
(checked before any eval runs). Steps, each skipped when its output exists, so an interrupted
publish resumes:

1. the page's evals of the published head (run_bench.eval_plan, less the equal-compute pair that
   stays as it was) into LAST/eval-NAME, one at a time on one thread (`--jobs 2` on an idle machine);
2. docs/results-smollm2.json: the per-bench rows, the sweeps, the learning curve (the head before
   the sessions, then each session's held-out points, tokens counted on from it), the evals' costs
   and commands (report_publish.publish_report); then the page and its figures rendered from it;
3. with `--export`: the head into models/smollm2-135m-eagle3 (bf16, SGLang layout), replacing it.

The eval sizes default to the ones the page was written with (`--max-new-tokens 64`); pass the
same flags as run_bench.py to change them.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import E3, REPO, Recorder  # noqa: E402
from benchmarks.smollm2.report import PAIR_EVALS  # noqa: E402
from benchmarks.smollm2.report_publish import PublishError, page_sessions, publish_report  # noqa: E402
from benchmarks.smollm2.run_bench import eval_cmd, eval_plan  # noqa: E402

PUBLISHED_HEAD = REPO / "models" / "smollm2-135m-eagle3"


def published_evals(last: Path, args) -> dict:
    """The page's evals of the published head, all in LAST (the pair's runs are not needed)."""
    plan = eval_plan(last, last, last, args)
    return {k: v for k, v in plan.items() if k not in PAIR_EVALS}


def check_sessions(sessions: list[Path]) -> None:
    """Each session a finished training run with a head, or exit 2 saying which is not."""
    for run in sessions:
        missing = [p for p in (run / "head", run / "train" / "metrics.jsonl") if not p.exists()]
        if missing:
            print(
                f"error: {run} is not a finished training run (no {', '.join(str(p) for p in missing)}); "
                "expected the run folders of the long run's sessions, oldest first, e.g. --sessions "
                "runs/long-s1 runs/long-s2. Finish the session with its `eagle3 train` command first.",
                file=sys.stderr,
            )
            raise SystemExit(2)


def check_done_evals(last: Path, evals: dict, steps: dict, args, rec: Recorder) -> None:
    """An eval folder publish would skip must hold this plan's eval: one it did not run (no entry
    in publish-steps.json, e.g. a hand-run `eagle3 eval --out LAST/eval-gsm8k`) or ran with other
    settings would be published silently in its place, so exit 2 naming it."""
    for name, (run, bench, prompts, extra) in evals.items():
        dest = last / f"eval-{name}"
        if not (dest / "report.json").exists():
            continue
        planned = rec.show(eval_cmd(run, dest, bench, prompts, args, *extra))
        recorded = steps.get(f"eval_{name}", {}).get("command")
        if recorded != planned:
            why = "was not written by publish.py" if recorded is None else f"was run as `{recorded}`"
            print(
                f"error: {dest} {why}; expected `{planned}`. Move that folder aside (or delete it) and "
                "rerun publish.py: it runs the page's eval there.",
                file=sys.stderr,
            )
            raise SystemExit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=Path, nargs="+", required=True, help="the sessions' run folders, oldest first")
    ap.add_argument("--mt-bench-prompts", type=int, default=80)
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--sampling-prompts", type=int, default=20)
    ap.add_argument("--sweep-prompts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per eval")
    ap.add_argument("--jobs", type=int, default=1, help="evals run this many at a time")
    ap.add_argument("--results-md", type=Path, default=REPO / "docs" / "results-smollm2.md")
    ap.add_argument("--report-only", action="store_true", help="no eval runs: write the page from the evals done")
    ap.add_argument("--continue", dest="keep", action="store_true",
                    help="keep the sessions the page already publishes (their run folders may be gone); "
                         "--sessions names only the ones trained since, oldest first")  # fmt: skip
    ap.add_argument("--export", action="store_true", help=f"then export the head into {PUBLISHED_HEAD.name}")
    args = ap.parse_args()
    sessions = [s.resolve() for s in args.sessions]
    check_sessions(sessions)
    last = sessions[-1]
    evals = published_evals(last, args)
    rec, lock = Recorder(), threading.Lock()
    steps_file = last / "publish-steps.json"
    steps = json.loads(steps_file.read_text()) if steps_file.exists() else {}

    def run_eval(name: str) -> None:
        run, bench, prompts, extra = evals[name]
        dest = last / f"eval-{name}"
        if (dest / "report.json").exists():
            return
        cmd = eval_cmd(run, dest, bench, prompts, args, *extra)
        rec.sh(cmd, env={"OMP_NUM_THREADS": str(args.threads)})
        shown = rec.show(cmd)
        with lock:  # the page's Costs table reads eval times and peak memory from here
            steps[f"eval_{name}"] = {
                "command": shown,
                "seconds": rec.seconds[shown],
                "peak_rss_mib": rec.peak_rss_mib[shown],
            }
            steps_file.write_text(json.dumps(steps, indent=2) + "\n")

    check_done_evals(last, evals, steps, args, rec)
    if args.keep:  # refused before an hour of evals, not after them
        try:
            page_sessions(json.loads(args.results_md.with_suffix(".json").read_text()), sessions)
        except (PublishError, OSError) as e:
            print(f"error: {e}; nothing was run or written", file=sys.stderr)
            raise SystemExit(2) from e
    if not args.report_only:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for f in [pool.submit(run_eval, name) for name in evals]:
                f.result()
    try:
        data = publish_report(args.results_md, sessions, evals, steps, keep=args.keep)
    except PublishError as e:
        print(f"error: {e}; nothing was written", file=sys.stderr)
        raise SystemExit(2) from e
    print(f"published {last.name}: MT-bench tau {data['published']['mt_bench_tau']:.3f} "
          f"(before {data['published']['mt_bench_tau_before']}) into {args.results_md}")  # fmt: skip
    if args.export:
        rec.sh([*E3, "export", "--head", last / "head", "--format", "sglang", "--dtype", "bf16",
                "--out", PUBLISHED_HEAD, "--overwrite"])  # fmt: skip


if __name__ == "__main__":
    main()
