"""What the tests of error messages share: a console wide enough that a message is one line, and
the text of what a command printed (which must never be a traceback). No tests here."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Import into a test module to make it autouse there."""
    monkeypatch.setenv("COLUMNS", "1000")


def err(capsys) -> str:
    cap = capsys.readouterr()
    text = " ".join((cap.out + cap.err).split())
    assert "Traceback" not in text
    return text


def gen_data_args(target, out, *flags: str) -> list[str]:
    """`eagle3 gen-data --target T --out OUT FLAGS...`, as `main` takes it."""
    return ["gen-data", "--target", str(target), "--out", str(out), *flags]


def eval_args(target, head, out, *flags: str) -> list[str]:
    """`eagle3 eval --target T --head H --out OUT FLAGS...`, as `main` takes it."""
    return ["eval", "--target", str(target), "--head", str(head), "--out", str(out), *flags]
