"""`eagle3 serve --engine llama.cpp` for real: a head exported to GGUF, llama-server started with the
target, a chat completion that speculates, and every process gone after SIGTERM.

The tiny target with a random head drafts but accepts ~nothing (asserted: draft_n > 0); the
committed SmolLM2 head on models/smollm2-135m (`make smollm2`) must accept (draft_n_accepted > 0).
Skipped, saying why, where llama-server is not built (`make llama-cpp`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from head_fixtures import make_head

from eagle3cli.gguf_export import llama_cpp_source
from eagle3cli.local_engine import free_port, which_llama_server

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "models" / "smollm2-135m"
SMOLLM2_HEAD = REPO / "models" / "smollm2-135m-eagle3"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(which_llama_server() is None, reason="llama-server is not built here: run `make llama-cpp`"),
    pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's converter is not here: run `make llama-cpp`"),
]


def _serve_and_chat(target: Path, head: Path, cache: Path, steps: int = 3) -> dict:
    port = free_port()
    env = {**os.environ, "EAGLE3_GGUF_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "eagle3cli", "serve", "--engine", "llama.cpp", "--target", str(target)]
    argv += ["--head", str(head), "--port", str(port), "--steps", str(steps), "--", "-t", "1", "-c", "2048", "-np", "1"]
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    engines: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            engines = [p for p in psutil.Process(proc.pid).children(recursive=True) if "llama-server" in p.name()]
            try:
                # ready once serve has compared the tokenizer too: its `ready at` line follows
                if engines and httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        time.sleep(3)  # serve's tokenizer check runs right after /health answers
        assert proc.poll() is None, "serve stopped after the engine was healthy (tokenizer check?)"
        body = {"messages": [{"role": "user", "content": "What is 17 * 23? Explain."}], "max_tokens": 48}
        r = httpx.post(url + "/v1/chat/completions", json={**body, "temperature": 0}, timeout=600)
        assert r.status_code == 200, r.text
        return r.json()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        for e in engines:
            assert not e.is_running() or e.status() == psutil.STATUS_ZOMBIE, f"llama-server {e.pid} outlived serve"
        assert "ready" in out.decode(errors="replace"), out.decode(errors="replace")[-3000:]


def test_tiny_target_with_an_exported_head_drafts_and_stops_clean(tmp_path):
    head = make_head(REPO / "models" / "tiny-target", tmp_path / "head")
    reply = _serve_and_chat(REPO / "models" / "tiny-target", head, tmp_path / "gguf")
    assert reply["choices"][0]["message"]["content"] is not None
    assert reply["timings"]["draft_n"] > 0


@pytest.mark.skipif(not (SMOLLM2 / "model.safetensors").exists(), reason="models/smollm2-135m absent: `make smollm2`")
def test_smollm2_head_is_accepted_in_llama_server(tmp_path):
    reply = _serve_and_chat(SMOLLM2, SMOLLM2_HEAD, tmp_path / "gguf")
    assert reply["timings"]["draft_n_accepted"] > 0, reply["timings"]
