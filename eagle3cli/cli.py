"""The `eagle3` command. Thin: each command parses flags, builds a typed config, calls
`run_<stage>(config)`. Errors of kind UsageError exit 2 with a message, never a traceback."""

from __future__ import annotations

import errno
import importlib
import os
import sys

import typer
from rich.markup import escape

from . import __version__
from .console import console
from .errors import UsageError
from .options import Group
from .urls import redact_text

HELP = """EAGLE-3 draft heads, end to end: regenerate data with the target, cache its hidden states,
train the head with training-time test, measure acceptance by depth, serve with SGLang.

[bold]The chain[/] (each stage reads the previous stage's folder and checks its manifest):

  eagle3 gen-data --target models/tiny-target --input gsm8k --run runs/demo
  eagle3 cache    --run runs/demo
  eagle3 train    --run runs/demo
  eagle3 eval     --run runs/demo --depth 8 --bench gsm8k
  eagle3 serve    --target models/tiny-target --head runs/demo/head --dry-run

Start on a new machine with [bold]eagle3 doctor[/].
"""

app = typer.Typer(
    name="eagle3",
    help=HELP,
    rich_markup_mode="rich",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    cls=Group,
)

# Each stage module defines `register(app)`, adding its command(s). Listed in chain order;
# a module is added here only once its command does real work.
COMMAND_MODULES = [
    "eagle3cli.doctor",
    "eagle3cli.data.cli",
    "eagle3cli.cache.cli",
    "eagle3cli.train.cli",
    "eagle3cli.export.cli",
    "eagle3cli.eval.cli",
    "eagle3cli.serve.cli",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"eagle3 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    pass


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point. Click handles its own usage errors (exit 2); ours get the same treatment."""
    try:
        try:
            app(args=argv, prog_name="eagle3")  # standalone: always ends in SystemExit
        except OSError as e:
            error = os_error(e)
            if error is None:
                raise
            raise error from e
        except RuntimeError as e:  # pathlib's resolve() before Python 3.13: "Symlink loop from '...'"
            if not str(e).startswith("Symlink loop"):
                raise
            raise symlink_loop(str(e).split("'")[1] if "'" in str(e) else "a path") from e
    except UsageError as e:
        console.print(f"[bold red]error:[/] {escape(redact_text(e.what))}")
        if e.expected:
            console.print(f"[bold]expected:[/] {escape(redact_text(e.expected))}")
        if e.next_step:
            console.print(f"[bold]next:[/] {escape(redact_text(e.next_step))}")
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_as_module() -> None:
    """`python -m eagle3cli`, which is how the DeepSpeed launcher starts training ranks: a rank
    ends through `end_rank` (it skips interpreter finalization, where a rank could abort)."""
    code = main()
    dist = sys.modules.get("torch.distributed")
    # only a rank with a process group up: importing train.loop (transformers) at every exit cost seconds
    if dist is not None and dist.is_available() and dist.is_initialized():
        from .train.loop import end_rank

        end_rank(code)
    sys.exit(code)


def _fsize_limit() -> str:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return "unlimited here" if soft == resource.RLIM_INFINITY else f"{soft} bytes here"


def os_error(e: OSError) -> UsageError | None:
    """A full disk, an unwritable or occupied path: what and where, exit 2, never a traceback.
    Every stage writes atomically and resumes, so the advice is always: fix it, rerun."""
    where = e.filename or "the output folder"
    rerun = "then rerun the same command: finished work is kept and the stage resumes where it stopped"
    if e.errno == errno.EFBIG:  # a limit on one file's size, not a full disk: freeing space changes nothing
        return UsageError(
            f"file too large writing {where} ({e.strerror}): it reached a file-size limit (the shell's "
            f"`ulimit -f`, {_fsize_limit()}, or the filesystem's largest file)",
            "a file-size limit above the files the stage writes",
            f"raise the limit (ulimit -f unlimited) or write to another filesystem (another --run/--out), {rerun}",
        )
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return UsageError(
            f"no space left writing {where} ({e.strerror})",
            "free space on that filesystem",
            f"free space (df -h {os.path.dirname(str(where)) or '.'}) or choose another --run/--out, {rerun}",
        )
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return UsageError(
            f"too many open files ({e.strerror}): this process reached its limit of open files"
            + (f" at {e.filename}" if e.filename else ""),
            "a limit on open files above the connections and files the stage holds",
            f"raise the limit (ulimit -n 65536) or lower --concurrency, {rerun}",
        )
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return UsageError(
            f"cannot write {where}: {e.strerror}",
            "an output folder this user can write",
            f"fix its permissions or choose another --run/--out folder, {rerun}",
        )
    if e.errno == errno.ELOOP:
        return symlink_loop(str(where))
    if e.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG):
        return UsageError(
            f"{where} is in the way: {e.strerror}",
            "a folder path where eagle3 can create its files (not an existing file)",
            f"move that file or choose another --run/--out folder, {rerun}",
        )
    return None


def symlink_loop(where: str) -> UsageError:
    return UsageError(
        f"{where} is a symbolic link that leads back to itself (a symlink loop)",
        "a folder, or a link to one",
        f"inspect it (ls -l {where}) and remove or fix the link, or choose another --run/--out folder",
    )


if __name__ == "__main__":
    sys.exit(main())
