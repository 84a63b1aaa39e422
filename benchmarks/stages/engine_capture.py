"""`eagle3 cache` with the target in eagle3 (hf) against the target in vLLM (`--engine vllm`), on the
same records, run side by side: both commands start together, each pinned to its own core with
OMP_NUM_THREADS=1 (the engine's OpenMP threads bound to the same core: VLLM_CPU_OMP_THREADS_BIND),
so load from other processes falls on both alike.

    .venv/bin/python benchmarks/stages/engine_capture.py --target models/smollm2-135m \
        --data corpora/smollm2-135m-sharegpt-vllm --max-samples 200 --work runs/bench/engine-capture \
        --out runs/bench/engine-capture.json

Prints one JSON object: each route's tokens/s (the manifest's: target forward + encode + write, model
load and engine start excluded) and wall seconds (everything), and the engine cache against the hf
cache per tensor: max over samples of max |engine - hf| / max |hf| (bf16 storage, so one rounding
step of bf16 is 0.4% of a value).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.common import print_result  # noqa: E402
from eagle3cli.engines.local_engine import _vllm_version, vllm_python  # noqa: E402


def cache_argv(args, out: Path, *more: str) -> list[str]:
    return [
        sys.executable, "-m", "eagle3cli", "cache", "--data", str(args.data), "--out", str(out),
        "--target", str(args.target), "--max-samples", str(args.max_samples), "--max-length", str(args.max_length),
        *more,
    ]  # fmt: skip


def side_by_side(runs: dict[str, tuple[list[str], int, dict]], logs: Path) -> dict[str, float]:
    """Start every command at once, each pinned to its core; wall seconds of each."""
    procs, t0, seconds = {}, time.time(), {}
    for name, (argv, core, env) in runs.items():
        procs[name] = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=(logs / f"{name}.log").open("w"), stderr=subprocess.STDOUT,
            preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}),
        )  # fmt: skip
    while len(seconds) < len(procs):  # each one's own finish time, whichever ends first
        for name, p in procs.items():
            if name not in seconds and p.poll() is not None:
                if p.returncode != 0:
                    raise SystemExit(f"{name} failed (exit {p.returncode}); see {logs / f'{name}.log'}")
                seconds[name] = round(time.time() - t0, 1)
        time.sleep(0.5)
    return seconds


def compare(hf: Path, engine: Path) -> dict:
    """Every tensor the reader gives: float ones as max over samples of max |engine - hf| / max |hf| (the
    issue's per-tensor measure) and of the per-token relative error ||engine - hf|| / ||hf|| (which a
    large outlier cannot hide); the stored argmax teacher as the share of tokens that differ."""
    import torch

    from eagle3cli.cache import CacheReader  # noqa: I001

    a, b = CacheReader(hf), CacheReader(engine)
    per_tensor: dict[str, float] = {}
    per_token: dict[str, float] = {}
    differ: dict[str, float] = {}
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for k in x.keys() - {"input_ids", "loss_mask"}:
            if x[k].is_floating_point():
                t = ((x[k] - y[k]).abs().max() / x[k].abs().max()).nan_to_num(float("inf")).item()
                r = ((x[k] - y[k]).norm(dim=-1) / x[k].norm(dim=-1).clamp_min(1e-30)).nan_to_num(float("inf"))
                per_tensor[k] = max(per_tensor.get(k, 0.0), t)
                per_token[k] = max(per_token.get(k, 0.0), r.max().item())
            else:
                differ[k] = max(differ.get(k, 0.0), (x[k] != y[k]).float().mean().item())
    return {
        "max_rel_err": round(max(per_tensor.values()), 5),
        "max_rel_err_by_tensor": {k: round(v, 5) for k, v in per_tensor.items()},
        "max_token_rel_err_by_tensor": {k: round(v, 5) for k, v in per_token.items()},
        "max_share_differing_by_tensor": {k: round(v, 5) for k, v in differ.items()},
    }


def train_both(args, runs: dict, env: dict) -> dict:
    """A head on each cache, same seed and steps, side by side; the held-out tau each ends with (each
    cache's own held-out samples: the same conversations, the same seeded split). With --init-head,
    also that head's held-out tau on each cache before any step."""
    steps = args.train_steps
    train = {
        name: (
            [
                sys.executable, "-m", "eagle3cli", "train", "--run", str(args.work / f"run-{name}"),
                "--cache", str(args.work / name), "--max-steps", str(steps), "--seed", "0",
                "--heldout-every", str(steps), "--log-every", str(min(10, steps)),
                "--save-every", str(min(10, steps) * max(1, steps // min(10, steps))),
                "--token-budget", str(args.train_token_budget),
                *(["--init-head", args.init_head] if args.init_head else []),
                *(["--recipe", args.train_recipe, "--no-compile"] if args.train_recipe else []),
            ],
            runs[name][1],
            env,
        )
        for name in runs
    }  # fmt: skip
    trained = all((args.work / f"run-{n}" / "head" / "config.json").exists() for n in train)
    if not (args.keep and trained):
        side_by_side(train, args.work)
    out: dict = {"train_steps": steps, "init_head": args.init_head, "train_token_budget": args.train_token_budget,
                 "train_recipe": args.train_recipe}  # fmt: skip
    for name in train:
        rows = [json.loads(x) for x in (args.work / f"run-{name}" / "train" / "metrics.jsonl").read_text().splitlines()]
        points = [r for r in rows if "heldout_tau" in r]
        out[f"heldout_tau_{name}"] = round(points[-1]["heldout_tau"], 4)
        if args.init_head:  # the same head, before a step: what the features alone change
            out[f"heldout_tau_init_{name}"] = round(points[0]["heldout_tau"], 4)
        out.setdefault("heldout_samples", points[-1].get("heldout_samples"))
    out["heldout_tau_diff"] = round(out["heldout_tau_engine"] - out["heldout_tau_hf"], 4)
    if args.eval_prompts:
        out.update(eval_both(args, train, env))
    out["commands"] = [
        " ".join(train[n][0])
        .replace(sys.executable, ".venv/bin/python")
        .replace(".venv/bin/python -m eagle3cli", "eagle3")
        for n in train
    ]
    return out


def eval_both(args, train: dict, env: dict) -> dict:
    """Each head on the same held-out ShareGPT prompts (eval's sharegpt bench: the corpus's held-out
    split), chain d8, fp32, greedy: tau per route and engine - hf paired by prompt (90% interval)."""
    from benchmarks.common import chain_of, counts, paired_delta

    evals = {
        name: (
            [
                sys.executable, "-m", "eagle3cli", "eval", "--head", str(args.work / f"run-{name}" / "head"),
                "--target", str(args.target), "--bench", "sharegpt", "--num-prompts", str(args.eval_prompts),
                "--max-new-tokens", "64", "--depth", "8", "--dtype", "fp32", "--mode", "chain",
                "--no-generate-baseline", "--threads", "1", "--max-prompt-tokens", "2048",
                "--out", str(args.work / f"eval-{name}"),
            ],
            core,
            env,
        )
        for name, (_, core, _) in train.items()
    }  # fmt: skip
    if not all((args.work / f"eval-{n}" / "report.json").exists() for n in evals):
        side_by_side(evals, args.work)
    per = {n: counts(chain_of(json.loads((args.work / f"eval-{n}" / "report.json").read_text()))) for n in evals}
    tau = {n: sum(c["emitted"]) / sum(c["rounds"]) for n, c in per.items()}
    diff, interval = paired_delta(per["engine"], per["hf"])
    return {
        "eval_tau_hf": round(tau["hf"], 4),
        "eval_tau_engine": round(tau["engine"], 4),
        "eval_tau_diff": diff,
        "eval_tau_diff_interval": interval,
        "eval_prompts": args.eval_prompts,
        "eval_commands": [" ".join(evals[n][0]).replace(sys.executable + " -m eagle3cli", "eagle3") for n in evals],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/smollm2-135m")
    ap.add_argument("--data", default="corpora/smollm2-135m-sharegpt-vllm")
    ap.add_argument("--max-samples", type=int, default=200)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=Path("runs/bench/engine-capture"))
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--train-steps", type=int, default=0, help="then train a head on each cache (same seed, steps)")
    ap.add_argument("--init-head", default=None, help="train from this head (its held-out tau on each cache at step 0)")
    ap.add_argument("--train-token-budget", type=int, default=4096)
    ap.add_argument("--train-recipe", default=None, help="train with this recipe (eager: no compile)")
    ap.add_argument("--eval-prompts", type=int, default=0, help="then eval each head on N held-out ShareGPT prompts")
    ap.add_argument("--keep", action="store_true", help="reuse the caches a previous run left in --work")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores: one per route")
    done = all((args.work / n / "manifest.json").exists() for n in ("hf", "engine"))
    if not (args.keep and done):
        shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    base = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cores = sorted(os.sched_getaffinity(0))[:2]
    runs = {
        "hf": (cache_argv(args, args.work / "hf"), cores[1], base),
        "engine": (
            cache_argv(args, args.work / "engine", "--engine", "vllm"),
            cores[0],
            {**base, "VLLM_CPU_OMP_THREADS_BIND": str(cores[0])},
        ),
    }
    previous = json.loads((args.work / "result.json").read_text()) if args.keep and done else None
    wall = previous["wall"] if previous else side_by_side(runs, args.work)
    (args.work / "result.json").write_text(json.dumps({"wall": wall}))
    manifests = {name: json.loads((args.work / name / "manifest.json").read_text()) for name in runs}
    tokens = manifests["hf"]["counts"]["tokens"]
    assert manifests["engine"]["counts"] == manifests["hf"]["counts"]
    result = {
        "target": str(args.target),
        "data": str(args.data),
        "samples": manifests["hf"]["counts"]["samples"],
        "tokens": tokens,
        "storage": manifests["hf"]["storage"],
        "how": "both routes at once, one core each (sched_setaffinity), OMP_NUM_THREADS=1; "
        "the engine's OpenMP threads bound to its core (VLLM_CPU_OMP_THREADS_BIND)",
        "tokens_per_s_hf": manifests["hf"]["throughput"]["tokens_per_s"],
        "tokens_per_s_engine": manifests["engine"]["throughput"]["tokens_per_s"],
        "wall_s_hf": wall["hf"],
        "wall_s_engine": wall["engine"],
        "engine": _vllm_version(vllm_python() or "") or "vllm",
        **compare(args.work / "hf", args.work / "engine"),
        "commands": [
            " ".join(runs[n][0])
            .replace(sys.executable, ".venv/bin/python")
            .replace(".venv/bin/python -m eagle3cli", "eagle3")
            for n in runs
        ],
    }
    if args.train_steps:
        trained = train_both(args, runs, base)
        result["commands"] += trained.pop("commands")
        result.update(trained)
    print_result(result, args.out)


if __name__ == "__main__":
    main()
