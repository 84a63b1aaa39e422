"""Acceptance against the amount of training data: the EAGLE-3 paper's scaling claim, for any target.

    # a cache over the whole corpus, once (eagle3 cache ...), then:
    .venv/bin/python benchmarks/stages/data_scaling.py --cache runs/smollm2-full/cache \
        --target models/smollm2-135m --recipe recipes/smollm2-135m/train.yaml \
        --fractions 1/16,1/8,1/4,1/2,1 --tokens-per-run 2000000 --out runs/data-scaling
    # or with no cache: every run computes the target's features as it trains (train --online)
    .venv/bin/python benchmarks/stages/data_scaling.py --data corpora/smollm2-135m-sharegpt-vllm \
        --target models/smollm2-135m --recipe recipes/smollm2-135m/train-online.yaml ...

For each fraction f, `eagle3 train --train-samples f*N` trains the same recipe on nested subsets of
the cache or corpus (one fixed order: every smaller subset is inside every larger one; N counts the
samples train reads, with --data the corpus's masked samples) and scores the head on
the held-out samples every run shares (the held-out tau of train's learning curve) and, unless
--no-eval, on MT-bench (80 first turns, fp32 greedy chain, depth 8). Budgets (say which you used):
`--steps-per-run S` trains every size S optimizer steps of the recipe's token budget (small subsets
repeat epochs: the question is what distinct data is worth at equal compute; `--tokens-per-run T` is
T // token budget steps), `--epochs E` trains each to E passes. A size whose one epoch is exactly S
steps is the same run either way (epoch 0's batches, a schedule over S steps), so `--reuse` takes its
one-epoch row: an equal-compute curve shares its largest size with the one-epoch curve.

Then tau is fitted as a + b*log2(distinct tokens) on all but the largest size, and that fit's
prediction for the largest is set beside the measured value (the test of the fit), and the fit over
every size says how many distinct tokens tau 2.5 and 3.0 would take. Runs resume (train and eval
do); `--dry-run` prints the commands. Writes OUT/data_scaling.json and OUT/data_scaling.png.
`--jobs N` trains N sizes side by side, each pinned to its own core with one thread, largest first.

--cache or --data? A cache computes each token's features once and is cheaper when a size repeats
epochs; --data needs no disk (a full SmolLM2 cache is ~23-46 GB) and no stage that must finish in the
session that trains on it: a run killed at a session's end resumes from its checkpoint in the next.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from fractions import Fraction
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import E3, REPO, Recorder  # noqa: E402


def fit_log2(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares tau = a + b*log2(tokens) through (tokens, tau) points; (a, b)."""
    xs = [math.log2(t) for t, _ in points]
    ys = [y for _, y in points]
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("a fit needs at least two different sizes")
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def tokens_for(tau: float, a: float, b: float) -> float | None:
    """Distinct tokens the fit says tau needs (None when tau does not grow with data)."""
    return 2 ** ((tau - a) / b) if b > 0 else None


def analyse(rows: list[dict], key: str, corpus_tokens: int | None = None) -> dict | None:
    """The fit of `key` against log2(distinct tokens), tested: fitted on all sizes but the largest, its
    prediction for the largest beside the measured value; then the fit over every size, the tokens it
    says tau 2.5 and 3.0 take, and (when the largest size is not the whole corpus) its tau for the corpus."""
    pts = [(r["tokens"], r[key]) for r in rows if r.get(key) is not None]
    if len(pts) < 3:
        return None
    pts.sort()
    a, b = fit_log2(pts[:-1])
    full_a, full_b = fit_log2(pts)
    fit = {
        "fit_on": f"the {len(pts) - 1} smaller sizes",
        "a": round(a, 4),
        "b_per_doubling": round(b, 4),
        "largest_tokens": pts[-1][0],
        "predicted_full": round(a + b * math.log2(pts[-1][0]), 4),
        "measured_full": round(pts[-1][1], 4),
        "fit_all": {"a": round(full_a, 4), "b_per_doubling": round(full_b, 4)},
        "tokens_for_tau": {str(t): tokens_for(t, full_a, full_b) for t in (2.5, 3.0)},
    }
    if corpus_tokens and corpus_tokens > pts[-1][0]:
        fit["corpus_tokens"] = corpus_tokens
        fit["predicted_corpus"] = round(full_a + full_b * math.log2(corpus_tokens), 4)
    return fit


def plot(
    rows: list[dict],
    fits: dict,
    out: Path,
    corpus_tokens: int | None = None,
    whole: dict | None = None,
    equal: tuple[list[dict], dict] | None = None,
) -> None:
    """tau against distinct tokens (log2), each fit dashed from the smallest size to past the corpus's size;
    WHOLE (the page JSON's `data_scaling_whole_corpus`) the long run's whole-corpus MT-bench point, apart; EQUAL
    (report.py's `data_scaling_equal_compute` rows and settings) the MT-bench curve at one step budget and
    the other corpora's points at that budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for key, label, style in (("heldout_tau", "held-out tau", "o-"), ("mt_bench_tau", "MT-bench tau (d8)", "s-")):
        pts = sorted((r["tokens"], r[key]) for r in rows if r.get(key) is not None)
        if not pts:
            continue
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)[0]
        f = fits.get(key)
        if f:
            xs = [pts[0][0], max(pts[-1][0] * 4, corpus_tokens or 0)]
            ax.plot(xs, [f["a"] + f["b_per_doubling"] * math.log2(x) for x in xs], "--", color=line.get_color(),
                    alpha=0.6, label=f"fit on smaller sizes: predicts {f['predicted_full']:.3f}, "
                    f"measured {f['measured_full']:.3f}")  # fmt: skip
            if f.get("predicted_corpus") is not None:
                ax.plot([f["corpus_tokens"]], [f["predicted_corpus"]], "x", color=line.get_color(), ms=9,
                        label=f"fit on all sizes at the whole corpus: {f['predicted_corpus']:.3f}")  # fmt: skip
    if equal:
        eq_rows, eq = equal
        pts = sorted((r["tokens"], r["mt_bench_tau"]) for r in eq_rows if r.get("mt_bench_tau") is not None)
        steps = eq["budget"]["steps_per_run"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "^-", color="tab:green",
                label=f"MT-bench tau (d8), every size {steps:,} steps (equal compute)")  # fmt: skip
        for p in eq.get("points") or []:
            ax.plot([p["tokens"]], [p["mt_bench_tau"]], "D", color="tab:red", ms=7,
                    label=f"{Path(p['data']).name}, {steps:,} steps: {p['mt_bench_tau']:.3f}")  # fmt: skip
    if whole:
        ax.plot([whole["distinct_tokens"]], [whole["mt_bench_tau"]], "*", color="black", ms=12,
                label=f"MT-bench, whole corpus{' + --extra-data' if whole.get('extra_data') else ''} by the long run "
                      f"(not the sizes' recipe): {whole['mt_bench_tau']:.3f}")  # fmt: skip
    if corpus_tokens:
        ax.axvline(corpus_tokens, color="grey", lw=0.8, ls=":")
        ax.annotate("whole corpus", (corpus_tokens, ax.get_ylim()[0]), rotation=90, va="bottom", ha="right",
                    fontsize=7, color="grey")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distinct training tokens (log2)")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def sample_lengths(a: argparse.Namespace, max_length: int) -> list[int]:
    """Token length of every sample train will read, in train's order: the cache's, or the corpus's
    masked samples (train's own function), so the full corpus's distinct tokens count as a size's do."""
    if a.cache:
        from eagle3cli.cache import CacheReader

        return [int(n) for n in CacheReader(Path(a.cache)).lengths]
    from eagle3cli.model.target import open_target
    from eagle3cli.train.data import online_samples

    return [len(ids) for ids, _ in online_samples(Path(a.data), open_target(a.target).tokenizer, max_length)]


def corpus_size(lengths: list[int], heldout_wanted: int) -> dict:
    """Samples and distinct tokens of the whole corpus minus train's held-out set (what fraction 1 trains on)."""
    from eagle3cli.train.heldout import heldout_indices

    held = set(heldout_indices(len(lengths), heldout_wanted))
    return {
        "samples": len(lengths) - len(held),
        "tokens": sum(n for i, n in enumerate(lengths) if i not in held),
        "heldout_samples": len(held),
    }


def one_size(frac: Fraction, run: Path, cmd: list, ev: list, a: argparse.Namespace, rec: Recorder, core) -> dict:
    """Train one size (and eval it), pinned to `core` when sizes run side by side; its row. A size
    finished by an earlier call with the same train command is not trained again (its row file), and
    its eval runs only when asked for and not yet made by the same eval command: a curve grows across
    calls and sessions (a held-out-only pass with --no-eval first, MT-bench later, or one more size)."""
    done = run / "data_scaling_row.json"
    row = json.loads(done.read_text()) if done.exists() else None
    if row is not None and row.get("commands", [None])[0] != rec.show(cmd):
        row = None  # another recipe or budget in this folder: train decides (it refuses a changed config)
    pin = ["taskset", "-c", str(core)] if core is not None else []
    env = {"OMP_NUM_THREADS": "1"} if core is not None else None  # one thread a core: two on one core crawl
    if row is None:
        rec.sh([*pin, *cmd], env=env)
        m = json.loads((run / "train" / "manifest.json").read_text())
        row = {
            "fraction": str(frac),
            "conversations": m["trained_samples"],
            "tokens": m["trained_sample_tokens"],
            "trained_tokens": m.get("tokens_seen"),
            "heldout_tau": (m.get("final_metrics") or {}).get("heldout_tau"),  # train's last held-out point
            "commands": [rec.show(cmd), None],
        }
        if row["heldout_tau"] is None:
            raise SystemExit(f"{run}/train/manifest.json has no held-out tau (final_metrics.heldout_tau): "
                             "train with --heldout-samples > 0")  # fmt: skip
        done.write_text(json.dumps(row, indent=1) + "\n")
    if not a.no_eval and row["commands"][1] != rec.show(ev):
        rec.sh([*pin, *ev], env=env)
        report = json.loads((run / "eval" / "report.json").read_text())
        head = next(iter(report["heads"].values()))
        row["mt_bench_tau"] = round(head["chain"]["acceptance"]["tau"], 4)
        row["commands"][1] = rec.show(ev)
        done.write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row), flush=True)
    return row


def epoch_steps(train_recipe: dict, token_budget: int, lengths: list[int], n: int) -> int:
    """Optimizer steps of one epoch over the first n samples: train's own held-out set, subset and batch plan
    under the recipe's batch limits (one process)."""
    import dataclasses

    from eagle3cli.train.config import TrainConfig
    from eagle3cli.train.data import plan_for
    from eagle3cli.train.heldout import heldout_indices, unused_indices

    known = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = dataclasses.replace(TrainConfig(), **{k: v for k, v in train_recipe.items() if k in known})
    cfg = dataclasses.replace(cfg, token_budget=token_budget)
    unused = unused_indices(len(lengths), heldout_indices(len(lengths), cfg.heldout_samples), n)
    return len(plan_for(cfg, lengths, 0, exclude=unused)) // max(1, cfg.grad_accum)


def _what(command: str | None) -> str | None:
    """A command without its run folder: what it trains or scores, not where."""
    return None if command is None else re.sub(r"--run \S+", "--run RUN", command)


def seed_rows(path: Path, jobs: list, rec: Recorder, one_epoch_is_budget: dict[int, bool] | None = None) -> None:
    """Write each reusable row of `path` as its size's row file (never over one this folder made): a row
    trained by this call's command (in any run folder), or by the one-epoch command of a size whose epoch is
    this budget's steps; its MT-bench tau counts when its eval is this call's too."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        earlier = data["data_scaling"] if "data_scaling" in data else data["rows"]  # a results page has `rows` too
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"--reuse {path}: expected data_scaling.py's data_scaling.json or a results JSON with a "
                         f"`data_scaling` key ({e})") from None  # fmt: skip
    by_train = {_what((r.get("commands") or [None])[0]): r for r in earlier}
    for _frac, n, run, cmd, ev in jobs:
        row = by_train.get(_what(rec.show(cmd)))
        if row is None and (one_epoch_is_budget or {}).get(n):
            i = cmd.index("--max-steps")
            row = by_train.get(_what(rec.show([*cmd[:i], "--epochs", 1])))
            row = row and {**row, "same_run_as": row["commands"][0]}
        done = run / "data_scaling_row.json"
        if row is not None and not done.exists():
            evaluated = _what(row["commands"][1]) == _what(rec.show(ev))
            if not evaluated:
                row = {k: v for k, v in row.items() if k != "mt_bench_tau"}
            row["commands"] = [rec.show(cmd), rec.show(ev) if evaluated else None]
            run.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps(row, indent=1) + "\n")
            print(f"reused from {path}: {row['fraction']} ({row['conversations']} samples)", flush=True)


def run_sizes(jobs: list, a: argparse.Namespace, rec: Recorder) -> list[dict]:
    """Every size's row, in the order given. With --jobs N, N sizes at a time, each on its own core,
    largest first (so the big run does not start last and leave the other cores idle)."""
    if a.jobs <= 1:
        return [one_size(frac, run, cmd, ev, a, rec, None) for frac, _n, run, cmd, ev in jobs]
    import queue
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    usable = sorted(os.sched_getaffinity(0))
    if shutil.which("taskset") is None or a.jobs > len(usable):
        raise SystemExit(f"--jobs {a.jobs}: pins each size to its own core with taskset (util-linux); this process "
                         f"may use {len(usable)} core(s) and taskset is {'' if shutil.which('taskset') else 'not '}"
                         "on PATH. Use --jobs 1, or at most the cores you have.")  # fmt: skip
    cores: queue.Queue[int] = queue.Queue()
    for c in usable[: a.jobs]:
        cores.put(c)

    def pinned(job):
        frac, _n, run, cmd, ev = job
        core = cores.get()
        try:
            return one_size(frac, run, cmd, ev, a, rec, core)
        finally:
            cores.put(core)

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futures = {id(j): pool.submit(pinned, j) for j in sorted(jobs, key=lambda j: -j[1])}
        return [futures[id(j)].result() for j in jobs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--cache", help="an eagle3 cache over the whole corpus")
    source.add_argument("--data", help="a finished gen-data folder: every run trains --online from it (no cache)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--recipe", default=None, help="the train recipe every size uses")
    ap.add_argument("--fractions", default="1/16,1/8,1/4,1/2,1")
    budget = ap.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps-per-run", type=int, help="equal compute: every size trains S optimizer steps")
    budget.add_argument("--tokens-per-run", type=int,
                        help="equal compute: T padded tokens, T // --token-budget steps (as --steps-per-run)")  # fmt: skip
    budget.add_argument("--epochs", type=int, help="every size trains E passes over its own subset")
    ap.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="tokens per training batch (train's --token-budget; default: the recipe's, else 4096)",
    )
    ap.add_argument("--no-eval", action="store_true", help="held-out tau only (no MT-bench eval)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="sizes trained side by side, each pinned to its own core with one thread (default 1)")  # fmt: skip
    ap.add_argument("--num-prompts", type=int, default=80)
    ap.add_argument("--out", default="runs/data-scaling")
    ap.add_argument("--reuse", default=None, metavar="JSON",
                    help="rows of an earlier curve (its data_scaling.json, or a results page's JSON with a "
                    "`data_scaling` key) count as done where their train command is this call's: a curve kept "
                    "in git grows on a fresh machine")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    for flag, value in (("--steps-per-run", a.steps_per_run), ("--tokens-per-run", a.tokens_per_run),
                        ("--epochs", a.epochs)):  # fmt: skip
        if value is not None and value < 1:
            ap.error(f"{flag} {value}: expected a positive integer")  # exit 2, before anything is read or trained
    out = Path(a.out)
    recipe = yaml.safe_load(Path(a.recipe).read_text(encoding="utf-8")) if a.recipe else {}
    train_recipe = (recipe or {}).get("train") or recipe or {}
    if a.token_budget is None:  # the recipe's own step size, so --tokens-per-run counts its steps right
        a.token_budget = int(train_recipe.get("token_budget") or 4096)
    from eagle3cli.errors import UsageError

    try:
        lengths = sample_lengths(a, int(train_recipe.get("max_length") or 2048))
    except UsageError as e:  # a corpus still being made (no manifest), a target without a tokenizer
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    corpus = corpus_size(lengths, int(train_recipe.get("heldout_samples", 32)))  # as train's held-out set
    trainable = corpus["samples"]
    rec = Recorder()
    steps = a.steps_per_run or (max(1, a.tokens_per_run // a.token_budget) if a.tokens_per_run else None)
    jobs = []
    for frac in [Fraction(f) for f in a.fractions.split(",")]:
        n = max(1, int(trainable * frac))
        run = out / f"n{n}"
        source = ["--cache", a.cache] if a.cache else ["--online", "--data", a.data, "--target", a.target]
        cmd = [*E3, "train", "--run", run, *source, "--train-samples", n, "--token-budget", a.token_budget]
        if a.recipe:
            cmd += ["--recipe", a.recipe]
        cmd += ["--max-steps", steps, "--epochs", 10**6] if steps else ["--epochs", a.epochs]
        ev = [*E3, "eval", "--run", run, "--target", a.target, "--bench", "mt_bench", "--num-prompts", a.num_prompts,
              "--depth", 8, "--mode", "chain", "--dtype", "fp32", "--temperature", 0]  # fmt: skip
        if a.dry_run:
            print(rec.show(cmd))
            if not a.no_eval:
                print(rec.show(ev))
            continue
        jobs.append((frac, n, run, cmd, ev))
    if a.reuse:
        one_epoch = {n: epoch_steps(train_recipe, a.token_budget, lengths, n) for _f, n, *_ in jobs} if steps else {}
        seed_rows(Path(a.reuse), jobs, rec, {n: k == steps for n, k in one_epoch.items()})
    rows = run_sizes(jobs, a, rec)
    if a.dry_run:
        return
    fits = {k: f for k in ("heldout_tau", "mt_bench_tau") if (f := analyse(rows, k, corpus["tokens"]))}
    result = {
        **({"cache": str(a.cache)} if a.cache else {"data": str(a.data), "online": True}),
        "budget": {"steps_per_run": steps, "token_budget": a.token_budget} if steps else {"epochs": a.epochs},
        "corpus": corpus,
        "rows": rows,
        "fits": fits,
        "commands": rec.commands,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(rows, fits, out / "data_scaling.png", corpus["tokens"])
    print(json.dumps(result, indent=1))
    print(f"wrote {out / 'data_scaling.json'} and {out / 'data_scaling.png'} (repo {REPO})")


if __name__ == "__main__":
    main()
