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

from eagle3cli.engines.gguf_export import llama_cpp_source
from eagle3cli.engines.local_engine import free_port, which_llama_server

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
        text = out.decode(errors="replace")
        # `ready at URL` is printed only after llama-server's /tokenize and /apply-template agreed with
        # transformers (serve.llama_cpp.tokenizer_check); a difference stops the server instead
        assert "ready at " in text, text[-3000:]


def test_tiny_target_with_an_exported_head_drafts_and_stops_clean(tmp_path):
    head = make_head(REPO / "models" / "tiny-target", tmp_path / "head")
    reply = _serve_and_chat(REPO / "models" / "tiny-target", head, tmp_path / "gguf")
    assert reply["choices"][0]["message"]["content"] is not None
    assert reply["timings"]["draft_n"] > 0


@pytest.mark.skipif(not (SMOLLM2 / "model.safetensors").exists(), reason="models/smollm2-135m absent: `make smollm2`")
def test_smollm2_head_is_accepted_in_llama_server(tmp_path):
    reply = _serve_and_chat(SMOLLM2, SMOLLM2_HEAD, tmp_path / "gguf")
    assert reply["timings"]["draft_n_accepted"] > 0, reply["timings"]


def test_tokenizer_check_passes_for_the_converted_tokenizer_and_catches_another(tmp_path):
    """serve's post-start check against a real llama-server: the tiny target's GGUF (its pre-tokenizer
    named by eagle3, not by the converter's hash table) tokenizes and templates like transformers;
    the same server checked against another tokenizer (SmolLM2's, or a changed chat template) is refused."""
    import json
    import shutil

    from eagle3cli.engines.gguf_export import export_gguf, read_gguf
    from eagle3cli.serve.llama_cpp import tokenizer_check

    tiny = REPO / "models" / "tiny-target"
    out = export_gguf(None, tiny, tmp_path / "gguf")
    assert read_gguf(out / "target.gguf", tensors=False).fields["tokenizer.ggml.pre"] == "gpt-2"
    port = free_port()
    argv = [which_llama_server(), "-m", str(out / "target.gguf"), "--port", str(port), "-t", "1", "-c", "512"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, "llama-server stopped"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert tokenizer_check(url, tiny) is None
        other = tmp_path / "other-template"
        shutil.copytree(tiny, other)
        cfg = json.loads((other / "tokenizer_config.json").read_text())
        if (other / "chat_template.jinja").is_file():
            (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        else:
            cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
            (other / "tokenizer_config.json").write_text(json.dumps(cfg))
        assert "chat template" in (tokenizer_check(url, other) or "")
        if (SMOLLM2 / "tokenizer.json").is_file():
            assert "tokenizes" in (tokenizer_check(url, SMOLLM2) or "")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
