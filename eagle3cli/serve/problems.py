"""What a preflight check finds: a problem, its fix, and whether it stops `eagle3 serve`.

Checks return lists of problems rather than raising, so serve reports every one at once. A
`Problem` is the head check's (`head.check`), which serve's own checks of flags and the machine
return too.
"""

from __future__ import annotations

from ..errors import UsageError
from ..head.check import Problem, error, warning

__all__ = ["Problem", "error", "raise_if_errors", "warning"]


def raise_if_errors(problems: list[Problem], next_step: str) -> None:
    """One UsageError naming every error (and its fix); warnings are the caller's to print."""
    errors = [p for p in problems if p.is_error]
    if errors:
        lines = "\n".join(f"  - {p.what}\n    fix: {p.fix}" for p in errors)
        raise UsageError(f"preflight found {len(errors)} problem(s):\n{lines}", None, next_step)
