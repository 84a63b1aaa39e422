"""What a preflight check finds: a problem, its fix, and whether it stops `eagle3 serve`.

Checks return lists of problems rather than raising, so serve reports every one at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str
    severity: str = "error"  # "error" stops serve; "warning" is printed and serve goes on

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


def error(what: str, fix: str) -> Problem:
    return Problem(what, fix, "error")


def warning(what: str, fix: str) -> Problem:
    return Problem(what, fix, "warning")


def raise_if_errors(problems: list[Problem], next_step: str) -> None:
    """One UsageError naming every error (and its fix); warnings are the caller's to print."""
    errors = [p for p in problems if p.is_error]
    if errors:
        lines = "\n".join(f"  - {p.what}\n    fix: {p.fix}" for p in errors)
        raise UsageError(f"preflight found {len(errors)} problem(s):\n{lines}", None, next_step)
