"""The epoch curve (issue 62): does acceptance keep rising with more passes over one corpus, or peak
and fall while the loss keeps falling (as a peer's users measured for EAGLE-3 on Qwen3-4B)?

One head from scratch on the first --samples conversations of one corpus, the online recipe at a
constant learning rate (no warmup, no decay: pass p's weights are the same run's whatever number of
passes is asked, so the run grows one pass at a time by resuming with --epochs p+1). After each pass:
the train's held-out walk (depth 8) and eval on MT-bench's 80 first turns (chain d8, fp32, greedy, 64
tokens), as the levers are scored (--mt-bench-prompts 40: the first 40 of them, at half the cost). Resumable: rerun the same command after a kill.

    .venv/bin/python benchmarks/smollm2/epoch_curve.py --passes 4 --samples 360 --mt-bench-prompts 40 --core 0 \
        --out runs/bench/epoch-curve.json

Then `--record docs/results-smollm2.json` writes the key `epoch_curve` there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import E3, Recorder, chain_of, counts, paired_delta, print_result, record  # noqa: E402
from benchmarks.render import pyplot, save_figure  # noqa: E402

TARGET = "models/smollm2-135m"
RECIPE = "recipes/smollm2-135m/train-online.yaml"


def json_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def heldout_points(run: Path) -> list[dict]:
    return [r for r in json_lines(run / "train" / "metrics.jsonl") if "heldout_tau" in r]


def mt_bench(report: Path) -> dict:
    """The chain decoder's tau over the prompts (eval's report.json: heads.NAME.chain) and its per-prompt
    counts, so passes can be paired by prompt."""
    c = counts(chain_of(json.loads(report.read_text())))
    return {"mt_bench_tau": round(sum(c["emitted"]) / sum(c["rounds"]), 4), "mt_bench_per_prompt": c}


def paired_passes(points: list[dict]) -> list[dict]:
    """The points, each after the first with what its pass bought on MT-bench: the change from the pass before,
    paired by prompt, and its 90% interval."""
    for prev, point in zip(points, points[1:]):
        point["delta_vs_previous"], point["delta_interval"] = paired_delta(
            point["mt_bench_per_prompt"], prev["mt_bench_per_prompt"]
        )
    return points


def plot(curve: dict, out: Path) -> None:
    """Held-out and MT-bench tau after each pass (MT-bench with its paired interval against the pass before),
    and the training loss on its own axis: does acceptance turn down while the loss keeps falling?"""
    plt = pyplot()
    pts = curve["points"]
    passes = [p["pass"] for p in pts]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(passes, [p["heldout_tau"] for p in pts], "o-", label="held-out tau (train's walk, depth 8)")
    n = len(pts[0]["mt_bench_per_prompt"]["emitted"])
    ax.plot(passes, [p["mt_bench_tau"] for p in pts], "s-", label=f"MT-bench tau (eval, {n} prompts, chain d8)")
    for p in pts[1:]:  # the paired interval of each pass's MT-bench change, drawn around its point
        lo, hi = p["delta_interval"]
        ax.plot([p["pass"]] * 2, [p["mt_bench_tau"] - p["delta_vs_previous"] + lo,
                                  p["mt_bench_tau"] - p["delta_vs_previous"] + hi], color="#dd8452", lw=2, alpha=0.6)  # fmt: skip
    ax.set(xlabel=f"passes over {curve['samples']} conversations", ylabel="tau (tokens per target pass)")
    ax.set_xticks(passes)
    ax.grid(alpha=0.3)
    if any(p.get("loss") is not None for p in pts):
        loss = ax.twinx()
        loss.plot(
            passes, [p.get("loss") for p in pts], "^:", color="grey", label="train loss, the pass's mean (right axis)"
        )
        loss.set_ylabel("train loss")
        loss.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Epoch curve, SmolLM2-135M from scratch, constant lr (orange: the paired 90% interval of "
                 "each pass's MT-bench change)", fontsize=8)  # fmt: skip
    save_figure(fig, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="corpora/smollm2-135m-sharegpt-vllm")
    ap.add_argument("--samples", type=int, default=360, help="conversations in the corpus passed over")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--mt-bench-prompts", type=int, default=80, help="MT-bench first turns scored after each pass")
    ap.add_argument("--lr", default="5e-4", help="the constant learning rate (the recipe's peak)")
    ap.add_argument("--core", type=int, default=None, help="bind to this CPU core (taskset -c)")
    ap.add_argument("--run", type=Path, default=REPO / "runs" / "epoch-curve")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--record", type=Path, default=None, help="results JSON to write `epoch_curve` into")
    a = ap.parse_args()
    pin = ["taskset", "-c", str(a.core)] if a.core is not None else []
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    rec = Recorder()
    points = []
    for p in range(1, a.passes + 1):
        done = a.run / f"pass-{p}.json"
        if done.is_file():
            points.append(json.loads(done.read_text()))
            continue
        rec.sh([*pin, *E3, "train", "--recipe", RECIPE, "--run", a.run, "--data", a.data, "--target", TARGET,
                "--train-samples", a.samples, "--epochs", p, "--lr", a.lr, "--warmup-ratio", 0, "--min-lr-ratio", 1,
                "--heldout-every", 100000, "--save-every", 100, "--head-from", "last"], env=env)  # fmt: skip
        ev = a.run / f"eval-pass-{p}"
        rec.sh([*pin, *E3, "eval", "--head", a.run / "head", "--target", TARGET, "--bench", "mt_bench",
                "--num-prompts", a.mt_bench_prompts, "--max-new-tokens", 64, "--depth", 8, "--dtype", "fp32", "--mode", "chain",
                "--no-generate-baseline", "--threads", 1, "--out", ev], env=env)  # fmt: skip
        last = heldout_points(a.run)[-1]
        manifest = json.loads((a.run / "train" / "manifest.json").read_text())
        point = {
            "pass": p,
            "steps": last["step"],
            "heldout_tau": round(last["heldout_tau"], 4),
            **mt_bench(ev / "report.json"),
            "tokens_seen": last.get("tokens_seen"),
            "train_cpu_seconds": round((manifest.get("final_metrics") or {}).get("train_cpu_seconds") or 0),
        }
        done.write_text(json.dumps(point) + "\n")
        points.append(point)
    losses = [r for r in json_lines(a.run / "train" / "metrics.jsonl") if "loss" in r]
    for prev, point in zip([0, *(q["steps"] for q in points)], points):  # one batch's loss is noise: the pass's mean
        pass_rows = [r["loss"] for r in losses if prev < r["step"] <= point["steps"]]
        point["loss"] = round(sum(pass_rows) / len(pass_rows), 4) if pass_rows else None
    result = {
        "points": paired_passes(points),
        "samples": a.samples,
        "data": a.data,
        "recipe": f"{RECIPE} from scratch, constant lr {a.lr} (no warmup, no decay), one core, one thread",
        "eval": f"MT-bench's first {a.mt_bench_prompts} first turns, chain d8, fp32, greedy, 64 tokens; held-out: the "
        "train's walk (depth 8)",
        "command": " ".join(sys.argv).replace(sys.executable, ".venv/bin/python"),
    }
    if a.record:
        record(a.record, "epoch_curve", result)
    print_result(result, a.out)


if __name__ == "__main__":
    main()
