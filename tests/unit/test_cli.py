"""The CLI frame: help, version, doctor, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle3cli import __version__
from eagle3cli.cli import main
from eagle3cli.errors import UsageError


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3cli", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_stage_and_chain_examples():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("doctor", "gen-data", "cache", "train", "export", "eval", "serve", "serve-bench"):
        assert f" {cmd} " in r.stdout, cmd
    assert "eagle3 gen-data" in r.stdout and "eagle3 eval" in r.stdout


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"eagle3 {__version__}"


def test_bad_flag_exits_2_with_message():
    r = run("--no-such-flag")
    assert r.returncode == 2
    assert "No such option" in r.stderr


@pytest.mark.slow
def test_doctor_json_reports_versions_devices_and_disk():
    r = run("doctor", "--json")
    assert r.returncode == 0, r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    import torch
    import transformers

    assert checks["torch"]["detail"] == torch.__version__
    assert checks["transformers"]["detail"] == transformers.__version__
    assert checks["deepspeed"]["ok"]
    assert "cores" in checks["cpu"]["detail"]
    assert "GiB free" in checks["disk"]["detail"]
    assert checks["deepspeed launcher"]["ok"], checks["deepspeed launcher"]
    assert "sglang parser" in checks


@pytest.mark.slow
def test_doctor_table():
    r = run("doctor")
    assert r.returncode == 0
    assert "eagle3 doctor" in r.stdout and "deepspeed launcher" in r.stdout


def test_usage_error_exits_2(monkeypatch, capsys):
    from eagle3cli import doctor

    def boom(runs_dir, *args):
        raise UsageError("the thing is wrong", "a right thing", "eagle3 doctor --help")

    monkeypatch.setattr(doctor, "run_doctor", boom)
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert "the thing is wrong" in err and "expected:" in err and "next:" in err


@pytest.mark.parametrize("cmd", ["doctor", "gen-data", "cache", "train", "export", "eval", "serve", "serve-bench"])
def test_every_command_help_has_examples_one_command_per_line_as_typed(cmd):
    """Every command's help has examples, and none is rewrapped by an 80-column terminal: each starts
    its own line, and one that needs more lines continues with a shell backslash (serve's `--` stays
    beside its argument). In process (typer's runner renders the help as `eagle3 CMD --help` prints
    it: a process a command cost seconds of imports each); the entry point itself is tested above."""
    import typer.testing

    from eagle3cli.cli import app

    r = typer.testing.CliRunner().invoke(
        app, [cmd, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, prog_name="eagle3"
    )
    assert r.exit_code == 0 and "Examples:" in r.output
    tail = r.output.split("Examples:", 1)[1].splitlines()
    lines = [ln.strip() for ln in tail if ln.strip()]
    assert lines and lines[0].startswith(("eagle3 ", "#"))
    for prev, ln in zip(lines, lines[1:]):  # a line not starting a command continues a backslashed one
        assert ln.startswith(("eagle3 ", "#")) or prev.endswith("\\"), (prev, ln)
    if cmd == "serve":
        assert "-- --mem-fraction-static 0.8" in lines
