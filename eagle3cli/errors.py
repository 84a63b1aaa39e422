"""User-facing errors. Anything raised as `UsageError` exits 2 (`IncompleteError`: 3) with a message,
never a traceback."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: says what is wrong, what was expected, and the next command to run."""

    exit_code = 2

    def __init__(self, what: str, expected: str | None = None, next_step: str | None = None):
        self.what = what
        self.expected = expected
        self.next_step = next_step
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.what]
        if self.expected:
            parts.append(f"expected: {self.expected}")
        if self.next_step:
            parts.append(f"next: {self.next_step}")
        return "\n".join(parts)


class StageError(UsageError):
    """A stage's inputs do not fit together (e.g. a cache made with another target)."""


class IncompleteError(UsageError):
    """The stage stopped with work left that the same command finishes when rerun (e.g. records
    left pending while an endpoint was down). Exits 3, so scripts can tell "retry" from "fix"."""

    exit_code = 3
