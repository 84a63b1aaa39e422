"""Engine lifecycle with a stand-in engine: own process group, streamed log, health wait, clean stop.

The stand-in is a small Python HTTP server that, like SGLang, starts a child process (its
"scheduler") in the same process group, logs while "loading", then answers /health.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from eagle3cli.serve.launch import HEALTH_TIMEOUT_EXIT, exit_code, launch
from eagle3cli.serve.machine import free_port

STANDIN = textwrap.dedent("""
    import http.server, signal, subprocess, sys, time
    port, delay, mode, pidfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a "scheduler" process
    open(pidfile, "w").write(str(child.pid))
    print("standin: loading weights", flush=True)
    if mode == "crash":
        print("standin: CUDA out of memory", flush=True)
        sys.exit(7)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *a: (print("standin: SIGTERM, bye", flush=True), sys.exit(0)))
    time.sleep(delay)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    srv.timeout = 0.1
    print("standin: ready", flush=True)
    t0 = time.time()
    while not (mode == "exit3" and time.time() - t0 > 1.0):
        srv.handle_request()
    sys.exit(3)
""")


@pytest.fixture
def standin(tmp_path):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    pidfile = tmp_path / "child.pid"

    def argv(mode: str = "serve", delay: float = 0.3, port: int | None = None):
        port = port or free_port()
        return [sys.executable, str(script), str(port), str(delay), mode, str(pidfile)], port

    argv.pidfile = pidfile
    return argv


def assert_dead(pid: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} outlived the engine")


def child_pid(standin) -> int:
    return int(standin.pidfile.read_text())


def test_exit_code_mapping():
    assert exit_code(0) == 0 and exit_code(3) == 3 and exit_code(-signal.SIGTERM) == 143


def test_engine_exit_code_is_ours(standin, capfd):
    argv, port = standin("exit3")
    rc = launch(argv, "127.0.0.1", port, health_timeout_s=30, grace_s=2, ready_message="curl ...")
    err = capfd.readouterr().err
    assert rc == 3
    assert "engine | standin: loading weights" in err and "ready" in err and "curl ..." in err
    assert_dead(child_pid(standin))  # the orphaned "scheduler" is stopped with the group


def test_crash_before_healthy(standin, capfd):
    argv, port = standin("crash")
    assert launch(argv, "127.0.0.1", port, health_timeout_s=30, grace_s=2) == 7
    err = " ".join(capfd.readouterr().err.split())
    assert "CUDA out of memory" in err and "exited with code 7 before it was healthy" in err
    assert_dead(child_pid(standin))


def test_health_timeout_stops_the_group(standin, capfd):
    argv, port = standin("serve", delay=60)
    t0 = time.monotonic()
    assert launch(argv, "127.0.0.1", port, health_timeout_s=1.5, grace_s=2) == HEALTH_TIMEOUT_EXIT
    assert time.monotonic() - t0 < 20
    assert "not healthy" in capfd.readouterr().err
    assert_dead(child_pid(standin))


def _launcher(argv, port, grace=2.0) -> subprocess.Popen:
    code = (
        "import sys; from eagle3cli.serve.launch import launch; "
        f"sys.exit(launch({argv!r}, '127.0.0.1', {port}, health_timeout_s=60, grace_s={grace}))"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_ready(proc: subprocess.Popen) -> list[str]:
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("ready at"):
            return lines
    proc.kill()
    raise AssertionError("launcher never printed ready:\n" + "".join(lines))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_the_whole_group(standin, sig):
    """Ctrl-C (SIGINT) or SIGTERM to `eagle3 serve`: SIGTERM to the engine's group; its exit code is ours."""
    argv, port = standin("serve")
    proc = _launcher(argv, port)
    _wait_ready(proc)
    engine_pid = next(p.pid for p in psutil.Process(proc.pid).children() if "standin.py" in " ".join(p.cmdline()))
    assert os.getpgid(engine_pid) == engine_pid != os.getpgid(proc.pid)  # its own process group
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest  # the stand-in exits 0 on SIGTERM
    assert "stopping the engine's process group" in rest and "standin: SIGTERM, bye" in rest
    assert_dead(engine_pid)
    assert_dead(child_pid(standin))


def test_engine_ignoring_sigterm_is_killed(standin):
    argv, port = standin("stubborn")
    proc = _launcher(argv, port, grace=1.0)
    _wait_ready(proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL
    assert_dead(child_pid(standin))


def test_cli_serve_returns_the_engine_exit_code(standin, tiny_target_dir, tmp_path, monkeypatch, capfd):
    """`eagle3 serve` (no --dry-run) end to end with the stand-in in place of SGLang."""
    from serve_helpers import CHAIN, export_head, serve_args

    from eagle3cli.cli import main
    from eagle3cli.serve import run
    from eagle3cli.serve.commands import ParserCheck

    head = export_head(tmp_path / "head", tiny_target_dir)
    argv, port = standin("exit3")
    monkeypatch.setattr(run, "check_gpu", lambda engine: [])
    monkeypatch.setattr(run, "check_engine_installed", lambda engine, python=None: [])
    monkeypatch.setattr(run, "build_command", lambda *a, **k: argv)
    monkeypatch.setattr(run, "validate_sglang_argv", lambda a: ParserCheck(True, True, "stand-in"))
    code = main(serve_args(tiny_target_dir, head, "--port", str(port), *CHAIN, "--health-timeout", "30"))
    err = capfd.readouterr().err
    assert code == 3
    assert "sglang | standin: ready" in err and f"http://127.0.0.1:{port}/generate" in err
    assert_dead(child_pid(standin))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_serve_does_not_leave_the_engine_serving(standin):
    """kill -9 of `eagle3 serve` runs none of its handlers: the kernel tells the engine (PDEATHSIG)."""
    argv, port = standin("serve")
    proc = _launcher(argv, port)
    _wait_ready(proc)
    engine_pid = next(p.pid for p in psutil.Process(proc.pid).children() if "standin.py" in " ".join(p.cmdline()))
    proc.kill()
    proc.communicate(timeout=30)
    assert_dead(engine_pid, within=30)
    os.kill(child_pid(standin), signal.SIGKILL)  # the stand-in's own "scheduler" is the stand-in's to stop
