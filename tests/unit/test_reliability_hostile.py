"""Issue 35, data loss and secrets: no rerun destroys or tops up a finished gen-data folder with
another plan, the lock holds no command line and never follows a link, credentials in every
spelling of `--endpoint` stay off disk, serve's engine dies with serve, and the fingerprint memo
notices a target rewritten in place with its mtime kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_helpers import err, wide_console  # noqa: F401  (wide_console: autouse here)
from http_fixtures import HostileServer

from eagle3cli.cli import main


def prompts(path: Path, kinds: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": k, "prompt": k}) + "\n" for k in kinds))
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


# ---------------------------------------------------------------- gen-data reruns
def test_a_finished_run_whose_input_gained_rows_is_refused_not_topped_up(tmp_path, tiny_target_dir, capsys):
    src = tmp_path / "in.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]} for i in range(6)
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "d"
    args = ["gen-data", "--target", str(tiny_target_dir), "--no-regenerate", "--input", str(src), "--out", str(out)]
    args += ["--shard-size", "2"]
    assert main(args) == 0
    before = snapshot(out)
    with src.open("a") as f:  # the file gains rows: another plan
        f.write("".join(json.dumps({**rows[0], "id": f"new{i}"}) + "\n" for i in range(4)))
    assert main(args) == 2
    text = err(capsys)
    assert "finished gen-data run over other input bytes" in text and "sha256" in text and "next:" in text
    assert snapshot(out) == before


@pytest.fixture(scope="module")
def hostile():
    s = HostileServer()
    yield s
    s.stop()


def test_an_extra_newline_in_rejects_then_a_dead_endpoint_loses_nothing(tmp_path, tiny_target_dir, hostile, capsys):
    src = prompts(tmp_path / "p.jsonl", ["fine-1", "inf", "fine-2", "fine-3", "deep"])
    out = tmp_path / "d"
    base = ["gen-data", "--target", str(tiny_target_dir), "--backend", "openai", "--input", str(src)]
    base += ["--out", str(out), "--shard-size", "2", "--retries", "0"]
    assert main([*base, "--endpoint", hostile.url]) == 0
    capsys.readouterr()
    before = snapshot(out)
    assert before["rejects.jsonl"].count(b"\n") == 2
    (out / "rejects.jsonl").write_bytes(before["rejects.jsonl"] + b"\n")
    assert main([*base, "--endpoint", "http://127.0.0.1:9"]) == 0  # nothing needs the endpoint
    assert snapshot(out) == before  # the newline is gone, every shard and the manifest as they were
    capsys.readouterr()
    # a rejects file with a record cut out: the shards stay; only the shard that lost a reject is redone
    lines = before["rejects.jsonl"].decode().splitlines(keepends=True)
    (out / "rejects.jsonl").write_text(lines[0])
    rc = main([*base, "--endpoint", "http://127.0.0.1:9"])
    assert rc == 3
    assert (out / "shard-00000.jsonl").read_bytes() == before["shard-00000.jsonl"]
    kept = [n for n in before if n.startswith("shard-") and (out / n).exists()]
    assert len(kept) == 2, kept
    assert main([*base, "--endpoint", hostile.url]) == 0
    assert snapshot(out)["rejects.jsonl"] == before["rejects.jsonl"]
    assert all(snapshot(out)[n] == before[n] for n in before if n.startswith("shard-"))


# ---------------------------------------------------------------- the lock and secrets
def test_the_lock_holds_no_command_line_and_never_follows_a_link(tmp_path, monkeypatch):
    from eagle3cli.errors import UsageError
    from eagle3cli.run_folder.lock import stage_lock

    monkeypatch.setattr("sys.argv", ["eagle3", "gen-data", "--endpoint", "http://u:hunter2@h:1/?api_key=s3cret"])
    folder = tmp_path / "d"
    with stage_lock(folder, "gen-data") as path:
        raw = path.read_text()
        assert set(json.loads(raw)) == {"pid", "host", "stage", "since"}
        assert "hunter2" not in raw and "s3cret" not in raw
        assert path.stat().st_mode & 0o7777 == 0o644 & ~_umask()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    folder.mkdir(exist_ok=True)
    (folder / ".lock").symlink_to(victim)
    with pytest.raises(UsageError) as e, stage_lock(folder, "gen-data"):
        pass
    assert "is a symbolic link" in e.value.what and e.value.next_step
    assert victim.read_text() == "keep me"


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


@pytest.mark.parametrize(
    "spelling",
    ["user:hunter2@{hp}", "http://user:hunter2@{hp}/v1#access_token=hunter2", "{hp}/v1?api_key=hunter2"],
)
def test_credentials_in_any_endpoint_spelling_never_reach_disk(tmp_path, tiny_target_dir, hostile, capsys, spelling):
    endpoint = spelling.format(hp=hostile.url.removeprefix("http://"))
    src = prompts(tmp_path / "p.jsonl", ["fine-1", "inf"])
    out = tmp_path / "d"
    args = ["gen-data", "--target", str(tiny_target_dir), "--backend", "openai", "--endpoint", endpoint]
    assert main([*args, "--input", str(src), "--out", str(out), "--retries", "0"]) == 0
    shown = err(capsys)
    assert "hunter2" not in shown
    written = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert b"hunter2" not in written and b"***" in (out / "manifest.json").read_bytes()


# ---------------------------------------------------------------- smaller holes
def test_the_digest_memo_notices_a_rewrite_that_kept_size_and_mtime(tmp_path, monkeypatch):
    import time

    from eagle3cli.run_folder import manifest

    monkeypatch.setenv("EAGLE3_CACHE_DIR", str(tmp_path / "memo"))
    monkeypatch.setattr(manifest, "_DIGESTS", {})
    f = tmp_path / "model.bin"
    f.write_bytes(b"a" * 4096)
    first = manifest.file_digest(f)
    st = f.stat()
    time.sleep(0.05)  # the kernel stamps ctime at a clock tick (ms): a rewrite in the same tick is not seen
    with open(f, "r+b") as fh:  # same inode, same size
        fh.write(b"b" * 4096)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the mtime put back
    assert (f.stat().st_size, f.stat().st_mtime_ns, f.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert manifest.file_digest(f) != first
    assert manifest.file_digest(f) == manifest.sha256_file(f)


def test_tilde_is_expanded_for_out_and_run_too(tmp_path, tiny_target_dir, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    base = ["gen-data", "--target", str(tiny_target_dir), "--no-regenerate", "--input", "gsm8k", "--num-samples", "2"]
    assert main([*base, "--out", "~/d"]) == 0
    assert (home / "d" / "manifest.json").exists()
    assert main([*base, "--run", "~/runs/x"]) == 0
    assert (home / "runs" / "x" / "data" / "manifest.json").exists()
    assert not (cwd / "~").exists()


def test_a_yaml_alias_bomb_recipe_is_refused_quickly(tmp_path, tiny_target_dir, capsys):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    r = tmp_path / "bomb.yaml"
    r.write_text("\n".join(lines) + "\n")
    args = ["gen-data", "--recipe", str(r), "--target", str(tiny_target_dir), "--input", "gsm8k", "--dry-run"]
    assert main(args) == 2
    text = err(capsys)
    assert "expands to more than 100000 values through YAML aliases" in text and "next:" in text
    # a smaller one that loads: the wrong-type message shows a summary, never the whole value
    r.write_text("gen_data:\n  seed: " + "[" + ", ".join(["[1, 2, 3, 4, 5, 6, 7, 8, 9]"] * 50) + "]\n")
    assert main(args) == 2
    text = err(capsys)
    assert "--seed <a list of 50 items>: expected an integer" in text and len(text) < 2000


@pytest.mark.parametrize("stage", ["gen-data", "cache"])
def test_a_run_folder_that_is_a_symlink_loop_exits_2(tmp_path, tiny_target_dir, capsys, stage):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    args = [stage, "--run", str(tmp_path / "a")]
    if stage == "gen-data":
        args += ["--target", str(tiny_target_dir), "--no-regenerate", "--input", "gsm8k", "--num-samples", "2"]
    assert main(args) == 2
    text = err(capsys)
    assert "symlink loop" in text and "next:" in text
