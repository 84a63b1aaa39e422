"""gen-data end to end through the CLI: kill -9 mid-run then resume gives exactly the records of an
uninterrupted run; a folder made with another target is refused; --no-regenerate; --dry-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import gen_data_args

from eagle3cli.cli import main
from eagle3cli.readers.sources import bundled

pytestmark = pytest.mark.integration


GSM8K_TEST, MT_BENCH = bundled("gsm8k_test.jsonl"), bundled("mt_bench_questions.jsonl")
# eval benches' files read as any file (gen-data refuses their prompts by default)
BOTH = ("--input", str(GSM8K_TEST), "--input", str(MT_BENCH), "--keep-eval")


def _args(target, out, *extra):
    sampling = ("--num-samples", "8", "--max-new-tokens", "12", "--temperature", "0.8", "--seed", "3")
    return gen_data_args(target, out, *BOTH, *sampling, "--batch-size", "2", "--shard-size", "3", *extra)


def _folder_bytes(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def _kill9_when(argv: list[str], ready) -> None:
    """`eagle3 ARGV` in a process of its own, killed with SIGKILL once `ready()` holds; it must still
    be running then."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle3cli", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        deadline = time.time() + 480  # generous: on a shared 2-core box the subprocess can be starved for minutes
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_kill9_then_resume_equals_uninterrupted_run(tiny_target_dir, tmp_path):
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    assert main(_args(tiny_target_dir, ref)) == 0
    journal = killed / "progress" / "shard-00001.journal.jsonl"
    # kill once shard 0 is complete and shard 1 is under way (journal written, or just completed):
    # completed shards, a journal and untouched shards are all exercised on resume
    _kill9_when(
        _args(tiny_target_dir, killed),
        lambda: (
            (journal.exists() and journal.read_bytes().count(b"\n") >= 1) or (killed / "shard-00001.jsonl").exists()
        ),
    )
    assert (killed / "shard-00000.jsonl").exists(), "no shard done before the deadline (machine starved?)"
    assert not (killed / "manifest.json").exists()
    assert main(_args(tiny_target_dir, killed)) == 0
    assert _folder_bytes(killed) == _folder_bytes(ref)
    m_ref, m_killed = (json.loads((d / "manifest.json").read_text()) for d in (ref, killed))
    assert m_killed["counts"] == m_ref["counts"] and m_killed["shards"] == m_ref["shards"]
    assert m_ref["counts"]["written"] == 8 and m_ref["regenerated"] is True
    ids = [json.loads(line)["id"] for f in sorted(ref.glob("shard-*.jsonl")) for line in f.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 8
    assert not (killed / "progress").exists()
    # a finished folder re-run is a no-op, not a duplicate
    assert main(_args(tiny_target_dir, killed)) == 0
    assert _folder_bytes(killed) == _folder_bytes(ref)


@pytest.mark.slow
def test_kill9_during_synthetic_and_several_answers_then_resume_equals_uninterrupted_run(trained_target_dir, tmp_path):
    """The levers' records (written prompts, K answers) resume as any: nothing lost, nothing duplicated,
    the same bytes; the final dedup pass runs once over the whole folder either way."""
    levers = ["--synthetic", "6", "--synth-min-words", "1", "--synth-max-tokens", "40", "--answers-per-prompt", "2",
              "--answer-temperatures", "0,0.9", "--input", str(GSM8K_TEST), "--keep-eval", "--num-samples", "3"]  # fmt: skip
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    rest = ("--max-new-tokens", "12", "--seed", "3", "--batch-size", "2", "--shard-size", "3")
    args = lambda out: gen_data_args(trained_target_dir, out, *levers, *rest)  # noqa: E731
    assert main(args(ref)) == 0
    _kill9_when(args(killed), (killed / "shard-00001.jsonl").exists)
    assert not (killed / "manifest.json").exists()
    assert main(args(killed)) == 0
    assert _folder_bytes(killed) == _folder_bytes(ref)
    ids = [json.loads(line)["id"] for f in sorted(ref.glob("shard-*.jsonl")) for line in f.read_text().splitlines()]
    assert len(ids) == len(set(ids)) and any(i.startswith("synthetic:") for i in ids) and any("#k" in i for i in ids)


def test_folder_from_another_target_is_refused(tiny_target_dir, deep_target_dir, tmp_path, capsys):
    out = tmp_path / "data"
    args = ["gen-data", "--input", str(GSM8K_TEST), "--keep-eval", "--num-samples", "2", "--max-new-tokens", "2"]
    args += ["--out", str(out)]
    assert main([*args, "--target", str(tiny_target_dir)]) == 0
    before = _folder_bytes(out)
    capsys.readouterr()
    assert main([*args, "--target", str(deep_target_dir)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "does not match" in err and "num_hidden_layers" in err
    assert _folder_bytes(out) == before
    assert main([*args, "--target", str(tiny_target_dir), "--seed", "5"]) == 2  # other settings: refused too


def test_no_regenerate_keeps_original_answers(tiny_target_dir, tmp_path):
    out = tmp_path / "orig"
    assert main(gen_data_args(tiny_target_dir, out, *BOTH, "--num-samples", "20", "--no-regenerate")) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["regenerated"] is False and m["counts"]["regenerated"] == 0
    recs = [json.loads(line) for line in (out / "shard-00000.jsonl").read_text().splitlines()]
    gsm = {json.loads(line)["question"]: json.loads(line)["answer"] for line in GSM8K_TEST.read_text().splitlines()}
    assert recs and all(r["meta"]["regenerated"] is False for r in recs)
    assert all(gsm[r["messages"][0]["content"]] == r["messages"][1]["content"] for r in recs)
    # MT-bench has no answers to keep: rejected with the reason, counted
    assert m["counts"]["skipped_by_reason"].get("no_assistant_answer", 0) == 20 - len(recs) > 0


def test_dry_run_writes_nothing(tiny_target_dir, tmp_path, capsys):
    out = tmp_path / "dry"
    assert main(gen_data_args(tiny_target_dir, out, "--input", str(MT_BENCH), "--keep-eval", "--dry-run")) == 0
    captured = capsys.readouterr()
    assert "<|im_start|>user" in captured.err and "mt-bench" in captured.out
    assert not out.exists()


def test_shard_slices_in_two_processes_equal_one_run(tiny_target_dir, tmp_path, capsys):
    """--shard 0/2 and 1/2 (one per core) write the shards of one run; the last one writes the manifest."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(_args(tiny_target_dir, one)) == 0
    assert main([*_args(tiny_target_dir, two), "--shard", "1/2"]) == 0
    assert not (two / "manifest.json").exists() and sorted(p.name for p in two.glob("shard-*.jsonl")) == [
        "shard-00001.jsonl"
    ]
    err = " ".join(capsys.readouterr().err.split())
    assert "the last `--shard i/2` process to finish writes the manifest" in err
    assert "gen-data slice 1/2 3/3" in err  # the progress of its own slice (shard 1: plan rows 3-5), not the run's
    assert main([*_args(tiny_target_dir, two), "--shard", "0/2"]) == 0
    assert "gen-data slice 0/2 5/5" in " ".join(capsys.readouterr().err.split())  # shards 0 and 2
    assert _folder_bytes(one).keys() == _folder_bytes(two).keys()
    for name, data in _folder_bytes(one).items():
        if name.startswith("shard-"):
            assert _folder_bytes(two)[name] == data, name
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (one, two))
    assert m1["counts"] == m2["counts"] and m1["shards"] == m2["shards"]
