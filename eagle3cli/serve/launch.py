"""Run the engine: own process group, streamed log, health wait, clean shutdown, its exit code.

The engine starts in a new session, so a terminal's Ctrl-C reaches only us; we forward SIGTERM
to the whole group (SGLang's tokenizer/scheduler/detokenizer processes included), wait a grace
period, then SIGKILL what is left. Whatever way it ends, no engine process outlives us.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape

from ..console import console, log
from ..engines.engine_api import is_healthy

HEALTH_TIMEOUT_EXIT = 124  # as timeout(1): the engine never became healthy in time


def local_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def exit_code(returncode: int) -> int:
    """A shell's view of a child's status: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _stream(pipe, prefix: str) -> None:
    # Plain writes, not rich: engine logs contain brackets rich would read as markup.
    for raw in iter(pipe.readline, b""):
        sys.stderr.write(f"{prefix} | {raw.decode(errors='replace').rstrip()}\n")
        sys.stderr.flush()
    pipe.close()


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the engine's process group, then SIGKILL whatever is still there after `grace_s`."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # leader gone; its group id was its pid (start_new_session)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break  # the group is empty
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.05)
    proc.poll()


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM):
    """A preexec_fn: the child gets `sig` when the thread that started it dies, even by SIGKILL
    (Linux's prctl(PR_SET_PDEATHSIG); our signal handlers cannot run after a kill -9). SIGTERM, not
    SIGKILL, so the engine can stop its own workers. None where there is no prctl (macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def _group_alive(pgid: int) -> bool:
    """Any member of the group still running? Zombies do not count: they wait for a reaper
    (pid 1 in a container may never reap), not for us."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, stop: threading.Event, poll_s: float = 0.5) -> str:
    """'healthy' | 'exited' | 'timeout' | 'stopped'."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stop.is_set():
            return "stopped"
        if proc.poll() is not None:
            return "exited"
        if is_healthy(url, timeout_s=2.0):
            return "healthy"
        stop.wait(poll_s)
    return "timeout"


def launch(
    argv: list[str],
    host: str,
    port: int,
    *,
    health_path: str = "/health",
    health_timeout_s: float = 900.0,
    ready_message: str = "",
    grace_s: float = 15.0,
    env: dict | None = None,
    cwd: Path | None = None,
    log_prefix: str = "engine",
    on_ready: Callable[[str], str | None] | None = None,
) -> int:
    """Start `argv`, stream its log, wait for `health_path`, then run until it exits or we are told to stop.

    Returns the exit code to use: the engine's (128+N if a signal ended it), 124 if it never became
    healthy within `health_timeout_s`. `on_ready(url)`, once healthy, returns what is wrong with the
    running server (None: nothing); then the engine is stopped and 2 returned (bad input).
    """
    stop = threading.Event()
    caught: list[int] = []

    def on_signal(signum, _frame):
        caught.append(signum)
        stop.set()

    in_main = threading.current_thread() is threading.main_thread()
    old = {}
    if in_main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
        cwd=cwd,
        preexec_fn=die_with_parent(),  # kill -9 of `eagle3 serve` must not leave the engine on the port
    )
    streamer = threading.Thread(target=_stream, args=(proc.stdout, log_prefix), daemon=True)
    streamer.start()
    url = f"http://{local_host(host)}:{port}"
    try:
        log(
            f"started (pid {proc.pid}, own process group); waiting for {url}{health_path} "
            f"(up to {health_timeout_s:.0f}s)",
            ("engine", "bold"),
        )
        state = wait_healthy(url + health_path, proc, health_timeout_s, stop)
        wrong = on_ready(url) if state == "healthy" and on_ready is not None else None
        if wrong:
            console.print(f"[bold red]error:[/] {escape(wrong)}; stopping the engine")
            stop_group(proc, grace_s)
            proc.wait()
            return 2
        if state == "healthy":
            console.print(f"[bold green]ready[/] at {escape(url)}")
            if ready_message:
                console.print(ready_message, markup=False, highlight=False)
            while proc.poll() is None and not stop.is_set():
                stop.wait(0.2)
        if state == "timeout":
            console.print(
                f"[bold red]error:[/] the engine was not healthy at {escape(url + health_path)} after "
                f"{health_timeout_s:.0f}s; stopping it (raise --health-timeout for large models)"
            )
        if proc.poll() is None:
            if caught:
                log(f"{signal.Signals(caught[0]).name}: stopping the engine's process group")
            stop_group(proc, grace_s)
        else:
            stop_group(proc, 2.0)  # the leader left; take any children it orphaned with it
        rc = proc.wait()
        if state == "exited":
            console.print(
                f"[bold red]error:[/] the engine exited with code {exit_code(rc)} before it was healthy "
                f"(its log is above)"
            )
            return exit_code(rc) or 1
        if state == "timeout":
            return HEALTH_TIMEOUT_EXIT
        log(f"engine exited with code {exit_code(rc)}")
        return exit_code(rc)
    finally:
        if proc.poll() is None:  # an exception in our own code: never leave the engine behind
            stop_group(proc, grace_s)
        streamer.join(timeout=2.0)
        for sig, handler in old.items():
            signal.signal(sig, handler)
