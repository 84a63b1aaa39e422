"""`eagle3 --help` and every stage's --help answer without importing torch, transformers or DeepSpeed
(seconds of imports to print text). Read from `python -X importtime`, which lists every module the
real entry point imported, lazy ones included."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eagle3cli.cli import app

HEAVY = ("torch", "transformers", "deepspeed")


def imported(*args: str) -> tuple[int, set[str]]:
    """Exit code and the top-level names of every module `python -X importtime ARGS` imported."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=300, check=False
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in r.stderr.splitlines()
        if line.startswith("import time:")
    }
    return r.returncode, names


def commands() -> list[str]:
    return sorted(c.name or c.callback.__name__ for c in app.registered_commands if c.callback)


def test_the_checker_sees_torch_when_it_is_imported():
    code, names = imported("-c", "import eagle3cli.speculate.chain")
    assert code == 0 and "torch" in names
    code, names = imported("-c", "import eagle3cli.speculate")  # the package alone loads no maths
    assert code == 0 and not names & set(HEAVY)


def test_every_stage_is_checked():
    assert {"doctor", "gen-data", "cache", "train", "export", "eval", "serve", "serve-bench"} <= set(commands())


@pytest.mark.parametrize("args", [(), *((c,) for c in commands())], ids=lambda a: " ".join(a) or "eagle3")
def test_help_imports_no_torch(args):
    code, names = imported("-m", "eagle3cli", *args, "--help")
    assert code == 0
    assert "eagle3cli" in names and "typer" in names
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
