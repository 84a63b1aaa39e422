"""Wall time of `eagle3 --help` (a stage's --help, `eagle3 doctor`) on this tree against an older commit's, in one run.

    .venv/bin/python benchmarks/stages/cli_startup.py [--old fe64b74] [--repeats 7] [--out FILE.json]

The old commit's package is unpacked with `git archive` into a temp folder (no worktree, no stash),
and each command runs as `python -m eagle3cli ...` from a neutral folder with the package first on
PYTHONPATH, OMP_NUM_THREADS=1, pinned to one core where `taskset` exists. Old and new alternate
every repeat, so a busy machine's drift falls on both; medians are kept. fe64b74 is the last commit
before the lazy imports (its --help imported torch through speculate/__init__.py).
Prints one JSON object: each side's seconds per command, old / new, and whether torch was imported
(by the command's own process: doctor asks torch in a child now, which is timed but not counted).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMANDS = (("--help",), ("train", "--help"), ("eval", "--help"), ("doctor", "--json"))


def unpack(rev: str, into: Path) -> Path:
    """The package as it was at `rev`, under `into` (only eagle3cli/: the command needs nothing else)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "eagle3cli"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run(root: Path, args: tuple[str, ...], cwd: Path, *python_flags: str) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system, its children included) for one `python -m eagle3cli ARGS`
    with `root` first on the path, and its stderr. On a busy machine the CPU seconds are what the
    command costs an idle core; the wall time includes the wait for one."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    cmd = [*pin, sys.executable, *python_flags, "-m", "eagle3cli", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode != 0 and not (args[0] == "doctor" and r.returncode == 1):  # doctor: 1 = a check failed
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    return seconds, cpu, r.stderr


def imports_torch(root: Path, args: tuple[str, ...], cwd: Path) -> bool:
    """Whether the command imported torch (an untimed run under -X importtime, which adds its own cost)."""
    stderr = run(root, args, cwd, "-X", "importtime")[2]
    return any(
        line.rsplit("|", 1)[-1].strip() == "torch" for line in stderr.splitlines() if line.startswith("import time:")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default="fe64b74", help="the commit to compare with")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="eagle3-cli-startup-") as tmp:
        old = unpack(a.old, Path(tmp) / "old")
        cwd = Path(tmp) / "cwd"
        cwd.mkdir()
        sides = {"old": Path(old), "new": REPO}
        times: dict[str, dict[str, list[float]]] = {s: {" ".join(c): [] for c in COMMANDS} for s in sides}
        cpu: dict[str, dict[str, list[float]]] = {s: {" ".join(c): [] for c in COMMANDS} for s in sides}
        # untimed: warms the file cache and says which commands load torch
        torch = {s: {" ".join(c): imports_torch(root, c, cwd) for c in COMMANDS} for s, root in sides.items()}
        for i in range(a.repeats):
            order = list(sides.items()) if i % 2 == 0 else list(sides.items())[::-1]
            for args in COMMANDS:
                for side, root in order:
                    wall, cpu_s, _ = run(root, args, cwd)
                    times[side][" ".join(args)].append(wall)
                    cpu[side][" ".join(args)].append(cpu_s)
    result = {
        "old": a.old,
        "repeats": a.repeats,
        "omp_num_threads": 1,
        "pinned_to_one_core": bool(shutil.which("taskset")),
        "load_average_at_end": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "commands": {
            cmd: {
                "old_s": round(statistics.median(times["old"][cmd]), 3),
                "new_s": round(statistics.median(times["new"][cmd]), 3),
                "old_over_new": round(statistics.median(times["old"][cmd]) / statistics.median(times["new"][cmd]), 1),
                "old_cpu_s": round(statistics.median(cpu["old"][cmd]), 3),
                "new_cpu_s": round(statistics.median(cpu["new"][cmd]), 3),
                "old_imports_torch": torch["old"][cmd],
                "new_imports_torch": torch["new"][cmd],
            }
            for cmd in times["new"]
        },
    }
    text = json.dumps(result, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
