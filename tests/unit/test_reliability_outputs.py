"""Issue 24: run folders that a wrong flag, a full disk or one bad row cannot destroy. Output folders
that belong to another stage or a user, tensors written through our own atomic writer, dead temps
removed by every stage, zero kept records refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from cli_helpers import err, wide_console  # noqa: F401  (wide_console: autouse here)
from disk_fixtures import fill, small_disk
from head_fixtures import make_head
from train_fixtures import REPO, make_run, write_data

from eagle3cli.cli import main
from eagle3cli.run_folder.manifest import folder_fingerprint, verify_shards


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ---------------------------------------------------------------- 1. another stage's folder
def test_no_stage_writes_into_another_stages_folder(tmp_path, tiny_target_dir, capsys):
    run = tmp_path / "a"
    data = write_data(run, tiny_target_dir, 4)
    head = make_head(tiny_target_dir, run / "head")
    before, head_before = snapshot(data), snapshot(head)
    commands = {
        "cache": ["cache", "--data", str(data), "--out", str(data), "--target", str(tiny_target_dir)],
        "eval": ["eval", "--head", str(head), "--target", str(tiny_target_dir), "--out", str(data)],
        "export": ["export", "--head", str(head), "--format", "speculators", "--out", str(data)],
        "serve-bench": [
            "serve-bench",
            "--spec-url",
            "http://127.0.0.1:9",
            "--prompts",
            "gsm8k",
            "--api",
            "openai",
            "--out",
            str(data),
        ],
    }
    for stage, args in commands.items():
        assert main(args) == 2, stage
        text = err(capsys)
        assert str(data) in text and ("gen-data" in text or "input" in text), (stage, text)
        assert snapshot(data) == before, stage
    # a stage's input folder is refused as its output, whatever it holds
    assert main(["export", "--head", str(head), "--format", "sglang", "--out", str(head)]) == 2
    assert "never writes into its own input folder" in err(capsys)
    assert main(["cache", "--data", str(data), "--out", str(data / "sub"), "--target", str(tiny_target_dir)]) == 2
    assert "inside this stage's input" in err(capsys)
    assert snapshot(head) == head_before
    # and gen-data still accepts its own folder: the data is intact (cache reads it)
    assert main(["cache", "--run", str(run), "--max-length", "64", "--draft-vocab-size", "64"]) == 0
    capsys.readouterr()


def test_a_users_manifest_or_files_in_out_are_never_overwritten(tmp_path, tiny_target_dir, capsys):
    head = make_head(tiny_target_dir, tmp_path / "head")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "manifest.json").write_text('{"my": "own notes"}\n')
    assert main(["export", "--head", str(head), "--format", "sglang", "--out", str(mine)]) == 2
    assert "not a manifest eagle3 wrote" in err(capsys)
    assert (mine / "manifest.json").read_text() == '{"my": "own notes"}\n'
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["export", "--head", str(head), "--format", "sglang", "--out", str(other)]) == 2
    assert "did not write: notes.txt" in err(capsys)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    # gen-data: a manifest that is not eagle3's (even a JSON list) is named, not a traceback
    (mine / "manifest.json").write_text("[1, 2]\n")
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": "hi"}) + "\n")
    args = ["gen-data", "--target", str(tiny_target_dir), "--input", str(inp), "--no-regenerate", "--out", str(mine)]
    assert main(args) == 2
    assert "eagle3 did not write" in err(capsys)
    # an export folder of our own is rewritten happily (a rerun of the same export)
    out = tmp_path / "exp"
    assert main(["export", "--head", str(head), "--format", "sglang", "--out", str(out)]) == 0
    assert main(["export", "--head", str(head), "--format", "sglang", "--out", str(out)]) == 0
    capsys.readouterr()


# ---------------------------------------------------------------- 4. a lost data shard
@pytest.mark.parametrize("damage", ["deleted", "edited"])
def test_gen_data_regenerates_exactly_a_lost_or_damaged_shard(tmp_path, tiny_target_dir, capsys, damage):
    src = tmp_path / "in.jsonl"
    rows = [{"id": f"r{i}", "prompt": f"question {i}?" + " and more" * (i % 3)} for i in range(9)]
    rows.append({"id": "r0", "prompt": "a duplicate id"})
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "data"
    args = ["gen-data", "--target", str(tiny_target_dir), "--input", str(src), "--out", str(out)]
    args += ["--max-new-tokens", "3", "--temperature", "0", "--shard-size", "2", "--max-prompt-tokens", "14"]
    assert main(args) == 0
    capsys.readouterr()
    before = snapshot(out)
    manifest = json.loads(before["manifest.json"])
    # rejects of reading and of generating: both must survive the repair
    assert set(manifest["counts"]["skipped_by_reason"]) == {"duplicate_id", "prompt_too_long"}
    lost = out / "shard-00001.jsonl"
    if damage == "deleted":
        lost.unlink()
    else:
        lost.write_bytes(lost.read_bytes().replace(b"question", b"QUESTION", 1))
    assert main(["cache", "--run", str(tmp_path), "--data", str(out), "--target", str(tiny_target_dir)]) == 2
    assert "regenerates exactly the missing or damaged shards" in err(capsys)
    assert main(args) == 0
    text = err(capsys)
    assert "shard-00001.jsonl missing or damaged" in text and "already complete" not in text
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k != "manifest.json"} == {
        k: v for k, v in before.items() if k != "manifest.json"
    }
    again = json.loads(after["manifest.json"])
    for key in ("shards", "counts", "rejects", "inputs"):
        assert again[key] == manifest[key], key
    assert main(args) == 0 and "already complete" in err(capsys)


# ---------------------------------------------------------------- 5. train resumes only on its own cache
TRAIN_FAST = ["--token-budget", "640", "--max-length", "160", "--ttt-steps", "2", "--log-every", "1"]


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory, tiny_target_dir):
    base = tmp_path_factory.mktemp("two-caches")
    return make_run(base / "a", tiny_target_dir, n=24), make_run(base / "b", tiny_target_dir, n=20)


def trained_two_steps(source_run, run):
    """`run` with a copy of `source_run`'s cache, trained 2 steps (a checkpoint at step 2); and the train args."""
    run.mkdir()
    shutil.copytree(source_run / "cache", run / "cache")
    args = ["train", "--run", str(run), *TRAIN_FAST, "--save-every", "2"]
    assert main([*args, "--max-steps", "2"]) == 0
    return run, args


def test_train_refuses_to_resume_on_another_cache(tmp_path, two_caches, capsys):
    a, b = two_caches
    run, args = trained_two_steps(a, tmp_path / "run")
    capsys.readouterr()
    head = snapshot(run / "head")
    shutil.rmtree(run / "cache")
    shutil.copytree(b / "cache", run / "cache")  # another run's cache where this run's was
    for steps in ("4", "2"):  # a mid-run resume, and a finished run (which kept its old head)
        assert main([*args, "--max-steps", steps]) == 2
        text = err(capsys)
        old = json.loads((run / "train" / "manifest.json").read_text())["input_fingerprint"]
        assert "trained on another cache" in text and old in text and "--no-resume" in text
        assert folder_fingerprint(json.loads((run / "cache" / "manifest.json").read_text())) in text
    assert snapshot(run / "head") == head
    shutil.rmtree(run / "cache")
    shutil.copytree(a / "cache", run / "cache")  # its own cache back: it resumes
    assert main([*args, "--max-steps", "4"]) == 0
    assert "resumed from step-0000002" in capsys.readouterr().err.replace("\n", " ")


# ---------------------------------------------------------------- 6. tensors through our own atomic writer
@pytest.fixture
def disk(tmp_path):
    with small_disk(tmp_path / "disk", "9m") as d:
        yield d


def no_temps(folder) -> list[str]:
    """Leftovers of any writer: ours (.NAME.HOST.PID.XXXX.tmp) or a library's (.tmpXXXXXX)."""
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith((".tmp", "tmp"))]


def test_a_full_disk_while_caching_exits_2_naming_the_shard_and_the_rerun_completes(
    disk, tiny_target_dir, monkeypatch, capsys
):
    import eagle3cli.cache.run as cache_run

    run = disk / "run"
    write_data(run, tiny_target_dir, 6)
    args = ["cache", "--run", str(run), "--max-length", "96", "--draft-vocab-size", "64", "--shard-tokens", "200"]
    real_check, ballast = cache_run._check_disk, []

    def then_another_job_fills_the_disk(cfg, out, *a):
        real_check(cfg, out, *a)  # the estimate fits...
        ballast.append(fill(disk, 150_000))  # ...then another job takes the space: room for 1 shard (~100 KB)

    monkeypatch.setattr(cache_run, "_check_disk", then_another_job_fills_the_disk)
    old = os.umask(0o022)
    try:
        assert main(args) == 2
        text = err(capsys)
        assert "no space left writing" in text and "cache/shard-00001.safetensors" in text and "resumes" in text
        cache = run / "cache"
        assert (cache / "shard-00000.safetensors").exists() and not no_temps(cache)
        for name in ("vocab.safetensors", "index.safetensors", "shard-00000.safetensors"):
            assert (cache / name).stat().st_mode & 0o777 == 0o644, name  # safetensors' own writer: 0600
        ballast[0].unlink()
        monkeypatch.setattr(cache_run, "_check_disk", real_check)
        assert main(args) == 0
        err(capsys)
    finally:
        os.umask(old)
    man = json.loads((cache / "manifest.json").read_text())
    assert len(man["shards"]) == 3 and not verify_shards(cache, man["shards"]) and not no_temps(cache)
    assert main(["cache", "--verify", str(cache), "--target", str(tiny_target_dir)]) == 0


def test_a_full_disk_at_export_exits_2_naming_the_file_and_leaves_no_temp(disk, tiny_target_dir, tmp_path, capsys):
    head = make_head(tiny_target_dir, tmp_path / "head")
    size = (head / "model.safetensors").stat().st_size
    ballast = fill(disk, size // 2)
    out = disk / "exp"
    assert main(["export", "--head", str(head), "--format", "speculators", "--out", str(out)]) == 2
    text = err(capsys)
    assert f"no space left writing {out / 'model.safetensors'}" in text
    assert not (out / "manifest.json").exists() and not no_temps(out)
    ballast.unlink()
    old = os.umask(0o027)
    try:
        import eagle3cli.run_folder.manifest as man

        man._UMASK = None
        assert main(["export", "--head", str(head), "--format", "speculators", "--out", str(out)]) == 0
    finally:
        os.umask(old)
        man._UMASK = None
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o640
    capsys.readouterr()


# ---------------------------------------------------------------- 7. dead temps removed by every stage
CUT = """
import sys, time
from pathlib import Path
from eagle3cli.run_folder.manifest import atomic_write
def write(tmp):
    tmp.write_bytes(b"x" * 100_000)
    print("writing", flush=True)
    time.sleep(300)
atomic_write(Path(sys.argv[1]), write)
"""


def killed_write(path) -> str:
    """Start a real atomic write of `path` and kill -9 it half way; returns the temp it leaves."""
    path.parent.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(path.parent))
    env = {k: v for k, v in os.environ.items()} | {"PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", CUT, str(path)], stdout=subprocess.PIPE, env=env)
    assert p.stdout.readline().strip() == b"writing"
    p.send_signal(signal.SIGKILL)
    p.wait()
    (left,) = set(os.listdir(path.parent)) - before
    return left


def test_every_stage_removes_the_temps_of_killed_writes(tmp_path, two_caches, tiny_target_dir, capsys):
    a, _ = two_caches
    run, args = trained_two_steps(a, tmp_path / "run")
    dead = {
        run / "train" / "checkpoints": killed_write(run / "train" / "checkpoints" / "step-0000004.safetensors"),
        run / "train": killed_write(run / "train" / "metrics.jsonl"),
        run / "head": killed_write(run / "head" / "model.safetensors"),
    }
    live = run / "head" / f".model.safetensors.{socket.gethostname()}.{os.getpid()}.abcd.tmp"
    live.write_bytes(b"a live writer's")  # this process is alive: its temp is not ours to remove
    assert main([*args, "--max-steps", "4"]) == 0
    for folder, name in dead.items():
        assert not (folder / name).exists(), name
    assert live.exists()
    exp = tmp_path / "exp"
    assert main(["export", "--head", str(run / "head"), "--format", "sglang", "--out", str(exp)]) == 0
    left = killed_write(exp / "model.safetensors")
    assert main(["export", "--head", str(run / "head"), "--format", "sglang", "--out", str(exp)]) == 0
    assert not (exp / left).exists()
    ev = tmp_path / "eval"
    left = killed_write(ev / "report.json")
    eval_args = ["eval", "--head", str(exp), "--target", str(tiny_target_dir), "--out", str(ev)]
    assert main([*eval_args, "--num-prompts", "1", "--max-new-tokens", "4", "--depth", "2"]) == 0
    assert not (ev / left).exists()
    capsys.readouterr()


def test_cache_verify_names_the_temps_of_killed_writes_and_a_rerun_removes_them(
    tmp_path, two_caches, tiny_target_dir, capsys
):
    a, _ = two_caches
    run = tmp_path / "run"
    shutil.copytree(a / "data", run / "data")
    shutil.copytree(a / "cache", run / "cache")
    left = killed_write(run / "cache" / "shard-00009.safetensors")
    assert main(["cache", "--verify", str(run / "cache"), "--target", str(tiny_target_dir)]) == 0
    text = err(capsys)
    assert "1 file(s)" in text and "not part of the cache" in text and left in text
    args = ["cache", "--run", str(run), "--target", str(tiny_target_dir), "--draft-vocab-size", "512"]
    assert main([*args, "--max-length", "160"]) == 0
    assert not (run / "cache" / left).exists()
    capsys.readouterr()
