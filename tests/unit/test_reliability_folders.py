"""Issue 13, run folders: one writer per stage folder, a fingerprint that sees every tensor, corrupt
weights and crafted manifests refused clearly, umask-respecting files, full disks and occupied
paths reported with exit 2 and resumable."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from cli_helpers import err, wide_console  # noqa: F401  (wide_console: autouse here)
from train_fixtures import REPO, write_data

from eagle3cli.cli import main
from eagle3cli.errors import StageError, UsageError
from eagle3cli.run_folder.manifest import atomic_write_text, model_fingerprint, verify_shards

HOLD = """
import sys, time
from pathlib import Path
from eagle3cli.run_folder.lock import stage_lock
with stage_lock(Path(sys.argv[1]), "test", *sys.argv[2:]):
    print("held", flush=True)
    time.sleep(300)
"""


@pytest.fixture
def holder():
    """Start a process that holds the lock of a folder; returns it (kill it to make the lock stale)."""
    procs = []

    def start(folder, *name):
        env = {k: v for k, v in os.environ.items() if k != "EAGLE3_LOCKS_HELD"} | {"PYTHONPATH": str(REPO)}
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), *name], stdout=subprocess.PIPE, env=env)
        assert p.stdout.readline().strip() == b"held"
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


# ---------------------------------------------------------------- 5. one writer per stage folder
def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path, tiny_target_dir, holder, capsys):
    run = tmp_path / "run"
    write_data(run, tiny_target_dir, 4)
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    commands = {
        "train": ["train", "--run", str(run), "--max-steps", "1"],
        "cache": ["cache", "--run", str(run), "--max-length", "64", "--draft-vocab-size", "64"],
        "eval": ["eval", "--run", str(run), "--target", str(tiny_target_dir)],
        "data2": ["gen-data", "--target", str(tiny_target_dir), "--input", str(data), "--no-regenerate", "--out"],
    }
    for folder, args in commands.items():
        target = run / folder
        if folder == "data2":
            args = [*args, str(target)]
        p = holder(target)
        assert main(args) == 2, folder
        text = err(capsys)
        assert f"{target} is being written by another eagle3" in text and f"pid {p.pid}" in text, text
        p.terminate()
        p.wait()

    # kill -9 leaves the lock file behind; the kernel released the lock, so the next writer proceeds
    p = holder(run / "cache")
    p.kill()
    p.wait()
    assert (run / "cache" / ".lock").exists()
    assert main(commands["cache"]) == 0
    assert (run / "cache" / "manifest.json").exists() and not (run / "cache" / ".lock").exists()


@pytest.mark.slow
def test_two_trains_on_one_run_the_second_is_refused(tmp_path, tiny_target_dir, capsys):
    from train_fixtures import make_run

    run = make_run(tmp_path / "run", tiny_target_dir, n=8)
    flags = ["--token-budget", "640", "--max-length", "160", "--ttt-steps", "1", "--log-every", "1"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("EAGLE3_LOCKS_HELD", None)
    cmd = [sys.executable, "-m", "eagle3cli", "train", "--run", str(run), *flags, "--max-steps", "100000"]
    first = subprocess.Popen(
        [*cmd, "--save-every", "100000"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        metrics = run / "train" / "metrics.jsonl"
        for _ in range(1200):  # until it is training (it holds the folder from its start)
            if metrics.exists() and metrics.stat().st_size or first.poll() is not None:
                break
            time.sleep(0.1)
        assert first.poll() is None
        lines = metrics.read_text().count("\n")
        assert main(["train", "--run", str(run), *flags, "--max-steps", "2", "--save-every", "2"]) == 2
        assert f"pid {first.pid}" in err(capsys)
        assert metrics.read_text().count("\n") >= lines  # the first run's metrics are untouched
    finally:
        first.kill()
        first.wait()
    assert main(["train", "--run", str(run), *flags, "--max-steps", "2", "--save-every", "2"]) == 0
    assert [json.loads(x)["step"] for x in (run / "train" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_cache_shard_processes_share_a_folder_but_not_a_slice(tmp_path, holder):
    from eagle3cli.run_folder.lock import stage_lock

    folder = tmp_path / "cache"
    holder(folder, ".lock.shard-0-of-2")
    with stage_lock(folder, "cache", ".lock.shard-1-of-2"):  # another slice: fine
        pass
    with pytest.raises(UsageError, match="being written by"), stage_lock(folder, "cache", ".lock.shard-0-of-2"):
        pass


def test_without_flock_a_pid_lock_of_a_dead_process_is_taken_over(tmp_path, monkeypatch):
    import socket

    from eagle3cli.run_folder import lock

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_flock)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / ".lock").write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "stage": "x"}))
    with lock.stage_lock(folder, "train"):
        assert json.loads((folder / ".lock").read_text())["pid"] == os.getpid()
    assert not (folder / ".lock").exists()

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / ".lock").write_text(json.dumps({"pid": alive.pid, "host": socket.gethostname(), "stage": "x"}))
        with pytest.raises(UsageError, match=f"pid {alive.pid}"), lock.stage_lock(folder, "train"):
            pass
    finally:
        alive.kill()
        alive.wait()


# ---------------------------------------------------------------- 6. every tensor counts
def _scaled_copy(src, dst, name="lm_head.weight", factor=1.05):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    t[name] = t[name] * factor
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_a_changed_lm_head_changes_the_fingerprint(tiny_target_dir, tmp_path):
    base = model_fingerprint(tiny_target_dir)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_target_dir, copy)
    assert model_fingerprint(copy) == base  # same bytes, same identity, wherever they are
    scaled = _scaled_copy(tiny_target_dir, tmp_path / "scaled")
    assert model_fingerprint(scaled) != base
    # rewritten in place: the remembered digest is keyed by size+mtime, so it is recomputed
    _scaled = _scaled_copy(tiny_target_dir, tmp_path / "again", "model.norm.weight", 2.0)
    before = model_fingerprint(_scaled)
    from safetensors.torch import load_file, save_file

    t = load_file(str(_scaled / "model.safetensors"))
    t["model.norm.weight"] = t["model.norm.weight"] / 2.0
    save_file(t, str(_scaled / "model.safetensors"), metadata={"format": "pt"})
    assert model_fingerprint(_scaled) == base != before


def test_the_transformers_version_that_saved_a_target_is_not_its_identity(tiny_target_dir, tmp_path):
    """A target converted again under a newer transformers (the SmolLM2 conversion under 5.25
    wrote the same bytes and config but `transformers_version`) keeps its data and heads; any
    other config change is another target."""
    base = model_fingerprint(tiny_target_dir)
    for key, value, same in [("transformers_version", "9.99.0", True), ("rms_norm_eps", 1e-3, False)]:
        copy = tmp_path / key
        shutil.copytree(tiny_target_dir, copy)
        cfg = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps(cfg | {key: value}))
        assert (model_fingerprint(copy) == base) is same, key


def test_folders_recorded_before_fingerprint_3_still_match_their_target(tiny_target_dir, tmp_path):
    """Scheme /2 hashed config.json whole: data, caches and heads recorded by it still match a target
    whose config was not re-saved, and still refuse another target."""
    import hashlib

    from eagle3cli.run_folder.manifest import check_matches, file_digest

    cfg = json.loads((tiny_target_dir / "config.json").read_text())
    weights = b"".join(
        f.name.encode() + b"\0" + file_digest(f).encode() for f in sorted(tiny_target_dir.glob("*.safetensors"))
    )
    before = hashlib.sha256(b"eagle3-fingerprint/2\n" + json.dumps(cfg, sort_keys=True).encode() + weights)
    now = model_fingerprint(tiny_target_dir)
    assert before.hexdigest()[:16] != now
    check_matches("data folder", {"fingerprint": before.hexdigest()[:16]}, {"fingerprint": now}, "next")
    scaled = model_fingerprint(_scaled_copy(tiny_target_dir, tmp_path / "scaled"))
    with pytest.raises(StageError, match="fingerprint"):
        check_matches("data folder", {"fingerprint": before.hexdigest()[:16]}, {"fingerprint": scaled}, "next")


def test_a_cache_refuses_a_target_whose_lm_head_changed(tmp_path, tiny_target_dir, capsys):
    scaled = _scaled_copy(tiny_target_dir, tmp_path / "scaled")
    run = tmp_path / "run"
    write_data(run, tiny_target_dir, 4)
    (run / "data" / "manifest.json").write_text(
        json.dumps(json.loads((run / "data" / "manifest.json").read_text()) | {"regenerated": True})
    )
    assert main(["cache", "--run", str(run), "--target", str(scaled)]) == 2
    assert "fingerprint" in err(capsys)


# ---------------------------------------------------------------- 11. corrupt weights
@pytest.mark.parametrize("damage", ["huge-header", "cut-short", "not-json"])
def test_corrupt_target_weights_are_a_clear_error(tiny_target_dir, tmp_path, capsys, damage):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_target_dir, bad)
    f = bad / "model.safetensors"
    data = f.read_bytes()
    if damage == "huge-header":
        data = (2**63).to_bytes(8, "little") + data[8:]
    elif damage == "cut-short":
        data = data[: len(data) // 2]
    else:
        data = data[:8] + b"\x00" * 64 + data[72:]
    f.write_bytes(data)
    with pytest.raises(UsageError, match="model.safetensors is not a valid safetensors file"):
        model_fingerprint(bad)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert main(["gen-data", "--target", str(bad), "--input", str(inp), "--dry-run"]) == 2
    assert "not a valid safetensors file" in err(capsys)


# ---------------------------------------------------------------- manifests stay inside their folder
@pytest.mark.parametrize("name", ["../outside.bin", "/etc/hostname", "sub/../../outside.bin", "link"])
def test_a_manifest_cannot_name_a_file_outside_its_folder(tmp_path, name):
    folder = tmp_path / "run" / "cache"
    folder.mkdir(parents=True)
    (tmp_path / "run" / "outside.bin").write_bytes(b"secret")
    os.symlink(tmp_path / "run" / "outside.bin", folder / "link")
    with pytest.raises(StageError, match="outside"):
        verify_shards(folder, [{"file": name, "bytes": 6, "sha256": "0"}])


def test_cache_verify_refuses_a_crafted_manifest(tmp_path, tiny_target_dir, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    atomic_write_text(
        cache / "manifest.json",
        json.dumps({"stage": "cache", "shards": [{"file": "../../etc/passwd", "bytes": 1, "sha256": "x"}]}),
    )
    assert main(["cache", "--verify", str(cache), "--target", str(tiny_target_dir)]) == 2
    text = err(capsys)
    assert "outside" in text and "rm " not in text  # and no advice to delete it


# ---------------------------------------------------------------- files honour the umask
def test_atomic_writes_honour_the_umask(tmp_path, monkeypatch):
    import eagle3cli.run_folder.manifest as man

    old = os.umask(0o027)
    try:
        monkeypatch.setattr(man, "_UMASK", None)
        atomic_write_text(tmp_path / "a.json", "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)
    monkeypatch.setattr(man, "_UMASK", None)
    atomic_write_text(tmp_path / "b.json", "{}")
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o666 & ~old


# ---------------------------------------------------------------- unwritable / occupied / full
def test_an_occupied_output_path_exits_2_naming_it(tmp_path, tiny_target_dir, capsys):
    (tmp_path / "runs").write_text("a file where the run folder should be")
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": "hi"}) + "\n")
    args = ["gen-data", "--target", str(tiny_target_dir), "--input", str(inp), "--no-regenerate"]
    assert main([*args, "--run", str(tmp_path / "runs" / "x")]) == 2
    assert f"{tmp_path / 'runs'}" in (text := err(capsys)) and "in the way" in text


# (a full disk while caching: test_reliability_outputs.py, on a real small tmpfs)
