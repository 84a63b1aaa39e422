"""benchmarks/stages/data_scaling.py end to end on a small random target: nested subsets of one
cache, each trained by `eagle3 train`, scored on the held-out samples they share, fitted and the
fit tested on the largest size. Reads what train wrote (its manifest), never assumes it."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from train_fixtures import REPO, make_run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("source", ["cache", "data"])
def test_nested_subsets_are_trained_scored_and_fitted(tiny_target_dir, tmp_path, source):
    # --data: every run trains --online from the corpus (no cache); the same nested sizes and held-out set.
    # It also runs the sizes two at a time (--jobs 2, each on its own core): rows still come in the order given
    run = make_run(tmp_path / "run", tiny_target_dir, n=60, draft_vocab_size=256, max_length=160)
    recipe = tmp_path / "train.yaml"
    recipe.write_text(
        "train:\n  ttt_steps: 2\n  compile: false\n  draft_vocab_size: 256\n  max_length: 160\n  heldout_depth: 4\n  log_every: 1\n  save_every: 2\n"
    )
    out = tmp_path / "scaling"
    cmd = [sys.executable, str(REPO / "benchmarks/stages/data_scaling.py"), f"--{source}", str(run / source),
           "--target", str(tiny_target_dir), "--recipe", str(recipe), "--fractions", "1/4,1/2,1",
           "--tokens-per-run", "1536", "--token-budget", "512", "--no-eval", "--out", str(out),
           *(["--jobs", str(min(2, len(os.sched_getaffinity(0))))] if source == "data" else [])]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env={"OMP_NUM_THREADS": "1",
                       "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((out / "data_scaling.json").read_text())
    rows = result["rows"]
    # 60 samples, 6 held out (a tenth): 54 trainable, nested 13 < 27 < 54
    assert [x["conversations"] for x in rows] == [13, 27, 54]
    assert rows[0]["tokens"] < rows[1]["tokens"] < rows[2]["tokens"]
    for x in rows:
        assert math.isfinite(x["heldout_tau"]) and x["heldout_tau"] >= 1.0, x
        assert x["trained_tokens"] > 0
    fit = result["fits"]["heldout_tau"]
    assert fit["measured_full"] == round(rows[-1]["heldout_tau"], 4)
    assert fit["fit_on"] == "the 2 smaller sizes" and math.isfinite(fit["predicted_full"])
    assert (out / "data_scaling.png").stat().st_size > 0
    assert result["budget"] == {"steps_per_run": 3, "token_budget": 512}
    # fraction 1 is the whole corpus less the held-out set: its distinct tokens are the corpus's
    assert result["corpus"] == {"samples": 54, "tokens": rows[-1]["tokens"], "heldout_samples": 6}
    if source == "cache":  # a second call reuses every finished size: same rows, nothing retrained
        stamps = {x["conversations"]: (out / f"n{x['conversations']}" / "train" / "manifest.json").stat().st_mtime_ns
                  for x in rows}  # fmt: skip
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                               env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads((out / "data_scaling.json").read_text())["rows"] == rows
        for n, stamp in stamps.items():
            assert (out / f"n{n}" / "train" / "manifest.json").stat().st_mtime_ns == stamp
        # a fresh machine: only the curve survives, in the results page's JSON (in git, beside the page's own
        # `rows`); --reuse takes its `data_scaling` rows and trains nothing
        kept = tmp_path / "results.json"
        kept.write_text(json.dumps({"rows": [{"bench": "mt_bench", "tau": 1.5}], "data_scaling": rows}))
        shutil.rmtree(out)
        fresh = subprocess.run([*cmd, "--reuse", str(kept)], capture_output=True, text=True, timeout=300, cwd=REPO,
                               env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
        assert fresh.returncode == 0, fresh.stderr[-3000:]
        assert json.loads((out / "data_scaling.json").read_text())["rows"] == rows
        assert not any(out.glob("n*/train")), "a reused size was trained again"
        # equal compute beside one epoch: S = the whole corpus's one epoch in steps; that size is the same run
        # under either budget (epoch 0's batches, a schedule over S steps), so --reuse takes its row
        base = [a for a in cmd if a not in ("--tokens-per-run", "1536")]
        frac_at = base.index("--fractions") + 1
        epoch = tmp_path / "epoch"
        one = [*base[:frac_at], "1", *base[frac_at + 1 :], "--epochs", "1"]
        one[one.index("--out") + 1] = str(epoch)
        env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
        assert subprocess.run(one, capture_output=True, text=True, timeout=300, cwd=REPO, env=env).returncode == 0
        steps = json.loads((epoch / "n54" / "train" / "manifest.json").read_text())["steps"]
        eq = tmp_path / "equal"
        equal = [*base[:frac_at], "1/4,1", *base[frac_at + 1 :], "--steps-per-run", str(steps),
                 "--reuse", str(epoch / "data_scaling.json")]  # fmt: skip
        equal[equal.index("--out") + 1] = str(eq)
        r = subprocess.run(equal, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        curve = json.loads((eq / "data_scaling.json").read_text())
        assert curve["budget"] == {"steps_per_run": steps, "token_budget": 512}
        assert not (eq / "n54" / "train").exists() and curve["rows"][1]["same_run_as"].endswith("--epochs 1")
        assert json.loads((eq / "n13" / "train" / "manifest.json").read_text())["steps"] == steps
    if source == "data":
        assert result["online"] is True
        for x in rows:  # each size really trained online, from the corpus
            manifest = json.loads((out / f"n{x['conversations']}" / "train" / "manifest.json").read_text())
            assert manifest["config"]["online"] is True, manifest["config"]
