"""Issue 35: every read of data eagle3 does not control is bounded. An input that never ends, a
compression bomb, a server that answers with a bomb, an endless or dripping body, JSON nested
thousands deep or holding Infinity: exit 2 (or that row rejected) with a message, never a
MemoryError, a RecursionError or a hang; memory stays under 2 GB."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from cli_helpers import err, wide_console  # noqa: F401  (wide_console: autouse here)
from http_fixtures import HostileServer, gzip_bomb
from train_fixtures import REPO

from eagle3cli.cli import main

GIB = 1 << 30


def run_cli(args: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """`eagle3 ARGS` in a child process: (the result, the child's peak memory in GiB)."""
    code = (
        "import resource, sys; from eagle3cli.cli import main; rc = main(sys.argv[1:]); "
        "sys.stderr.write('\\nPEAK_KB %d\\n' % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
    )
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000", **(env or {})}
    r = subprocess.run([sys.executable, "-c", code, *args], env=full_env, capture_output=True, text=True, timeout=600)
    peak = [int(line.split()[1]) for line in r.stderr.splitlines() if line.startswith("PEAK_KB")]
    return r, (peak[-1] * 1024 / GIB if peak else float("nan"))


# ---------------------------------------------------------------- input files
def test_a_device_as_input_exits_2_naming_it(tmp_path, tiny_target_dir, capsys):
    args = ["gen-data", "--target", str(tiny_target_dir), "--no-regenerate", "--out", str(tmp_path / "d")]
    assert main([*args, "--input", "/dev/zero"]) == 2
    text = err(capsys)
    assert "error: --input /dev/zero is a device, not a data file" in text and "next:" in text
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_inputs_read_and_a_cut_one_is_named(tmp_path, suffix):
    import bz2
    import gzip
    import lzma

    from eagle3cli.data.formats import parse_input_spec, read_input
    from eagle3cli.errors import UsageError

    mod = {".gz": gzip, ".bz2": bz2, ".xz": lzma}[suffix]
    rows = "".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(50))
    p = tmp_path / f"in.jsonl{suffix}"
    p.write_bytes(mod.compress(rows[:300].encode()) + mod.compress(rows[300:].encode()))  # two members
    assert len(read_input(parse_input_spec(str(p))).records) == 50
    p.write_bytes(mod.compress(rows.encode())[:-12])
    with pytest.raises(UsageError) as e:
        read_input(parse_input_spec(str(p)))
    assert "cannot be read as" in e.value.what and e.value.next_step


def test_a_gzip_bomb_input_stops_at_the_limit_under_2_gb(tmp_path, tiny_target_dir):
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip_bomb(4))  # 4 GiB of zeros once inflated
    out = tmp_path / "d"
    args = ["gen-data", "--target", str(tiny_target_dir), "--no-regenerate", "--input", str(bomb), "--out", str(out)]
    r, peak_gib = run_cli(args, {"EAGLE3_MAX_INPUT_BYTES": str(256 << 20)})
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    text = " ".join((r.stdout + r.stderr).split())
    assert "decompresses to more than 256.0 MiB" in text and "next:" in text and "EAGLE3_MAX_INPUT_BYTES" in text
    assert peak_gib < 2.0, peak_gib
    assert not out.exists()


def test_an_input_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    from eagle3cli.data.formats import parse_input_spec, read_input
    from eagle3cli.errors import UsageError

    p = tmp_path / "big.jsonl"
    p.write_text(json.dumps({"prompt": "x" * 5000}) + "\n")
    monkeypatch.setenv("EAGLE3_MAX_INPUT_BYTES", "4096")
    with pytest.raises(UsageError) as e:
        read_input(parse_input_spec(str(p)))
    assert "holds more than 4.0 KiB" in e.value.what
    monkeypatch.setenv("EAGLE3_MAX_INPUT_BYTES", "lots")
    with pytest.raises(UsageError) as e:
        read_input(parse_input_spec(str(p)))
    assert "EAGLE3_MAX_INPUT_BYTES='lots'" in e.value.what


# ---------------------------------------------------------------- HTTP bodies
@pytest.fixture(scope="module")
def hostile():
    s = HostileServer()
    yield s
    s.stop()


def test_hostile_replies_reject_their_rows_and_the_run_completes_under_2_gb(tmp_path, tiny_target_dir, hostile):
    kinds = ["fine-1", "bomb", "deep", "inf", "endless", "fine-2"]
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"id": k, "prompt": k}) + "\n" for k in kinds))
    out = tmp_path / "d"
    args = ["gen-data", "--target", str(tiny_target_dir), "--backend", "openai", "--endpoint", hostile.url]
    args += ["--input", str(src), "--out", str(out), "--retries", "1", "--backoff", "0.01", "--timeout", "60"]
    r, peak_gib = run_cli(args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 2
    rejects = {json.loads(line)["id"]: json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()}
    assert {k.split(":")[1] for k in rejects} == {"bomb", "deep", "inf", "endless"}
    assert {r["reason"] for r in rejects.values()} == {"unusable_response"}
    details = " ".join(r["detail"] for r in rejects.values())
    assert "over 67108864 bytes" in details and "levels deep" in details and "Infinity" in details
    assert peak_gib < 2.0, peak_gib


def test_timeout_is_for_the_whole_request_not_each_read(hostile):
    from eagle3cli.engines.engine_api import EngineClient, Unreachable, chat_body

    body = chat_body("m", [{"role": "user", "content": "drip"}], 8)

    async def go():
        async with EngineClient(timeout_s=1.5, concurrency=1) as c:
            return await c.post(hostile.url, "/v1/chat/completions", body)

    t0 = time.monotonic()
    with pytest.raises(Unreachable) as e:
        asyncio.run(go())
    # the server sends a byte every second forever: a per-read timeout of 1.5 s never fires
    assert time.monotonic() - t0 < 30 and e.value.timeout and "whole request" in e.value.detail


def test_reply_json_refuses_nan_infinity_and_deep_nesting():
    from eagle3cli.engines.engine_api import Reply
    from eagle3cli.readers.limits import UnusableReply

    for text in ('{"a": NaN}', '{"a": -Infinity}', '{"a": 1e400}', "[" * 3000 + "]" * 3000):
        with pytest.raises(UnusableReply):
            Reply(200, text, 0.0).json()
    assert Reply(200, '{"a": [[1.5]], "b": "[[[[{{{{"}', 0.0).json() == {"a": [[1.5]], "b": "[[[[{{{{"}
