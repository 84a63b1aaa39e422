"""What the bench orchestrators share: run a command from the repo root, remember it (with its
wall time and peak memory) for the results page, read the JSON the helper scripts print, and record
a measurement's key in a results page's JSON."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
E3 = [sys.executable, "-m", "eagle3cli"]


@dataclass
class Recorder:
    """Every command a bench ran, as shown on its results page, with seconds and peak RSS."""

    commands: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: dict[str, float] = field(default_factory=dict)

    def show(self, args: list) -> str:
        shown = " ".join(shlex.quote(str(a)) for a in args).replace(sys.executable, ".venv/bin/python")
        return shown.replace(".venv/bin/python -m eagle3cli", "eagle3").replace(f"{REPO}/", "")

    def sh(self, args: list, capture: bool = False, env: dict | None = None) -> str:
        """Run one command from the repo root; stop the bench if it fails."""
        shown = self.show(args)
        self.commands.append(shown)
        print(f"\n$ {shown}", flush=True)
        t0 = time.time()
        proc = subprocess.Popen(
            [str(a) for a in args],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE if capture else None,
            env={**os.environ, **(env or {})},
        )
        out = proc.stdout.read() if capture else ""
        _, status, usage = os.wait4(proc.pid, 0)  # per-child rusage: this command's own peak RSS
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.seconds[shown] = time.time() - t0
        self.peak_rss_mib[shown] = usage.ru_maxrss / 1024
        print(f"  ({self.seconds[shown]:.0f}s, peak {self.peak_rss_mib[shown]:.0f} MiB, exit {proc.returncode})")
        if proc.returncode != 0:
            raise SystemExit(f"bench step failed (exit {proc.returncode}): {shown}")
        return out


def last_json(text: str) -> dict:
    """The helper scripts print one JSON object (possibly pretty-printed) at the end."""
    start = text.rfind("\n{")
    return json.loads(text[start + 1 if start >= 0 else text.find("{") :])


def record(results_json: Path, key: str, value: object) -> None:
    """VALUE as KEY of RESULTS_JSON, its other keys kept ("a.b": key b of section a, the section's others
    kept). Renders nothing: the page is its renderer's (benchmarks/smollm2/report_page.py)."""
    data = json.loads(results_json.read_text(encoding="utf-8")) if results_json.exists() else {}
    *parents, last = key.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    results_json.write_text(json.dumps(data, indent=2) + "\n")


def print_result(result: dict, out: Path | None) -> None:
    """A measurement's JSON on stdout, and in OUT when given (its folder made)."""
    text = json.dumps(result, indent=2) + "\n"
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    print(text, end="")


# an eval report's chain decoder, and two heads (or two passes) compared on the same prompts
def chain_of(report: dict) -> dict:
    """The chain decoder's numbers of the report's one head (eval's report.json: heads.NAME.chain)."""
    if len(heads := report["heads"]) != 1:
        raise ValueError(f"an arm's eval holds one head, this one {len(heads)}")
    return next(iter(heads.values()))["chain"]


def counts(chain: dict) -> dict:
    """{emitted, rounds} per prompt of a chain decoder's report (tau = sum / sum): what pairing reads."""
    return {k: [r["accepted"] + r["rounds"] if k == "emitted" else r["rounds"] for r in chain["per_prompt"]]
            for k in ("emitted", "rounds")}  # fmt: skip


def paired_delta(a: dict, b: dict) -> tuple[float, list]:
    """tau(a) - tau(b) over the same prompts ({emitted, rounds} per prompt: tau = sum / sum), and its 90%
    percentile interval over prompts resampled together (eval's paired bootstrap)."""
    from eagle3cli.eval.metrics import bootstrap, sum_ratio

    if (n := len(a["emitted"])) == 0 or len(b["emitted"]) != n:
        raise ValueError(f"paired prompts expected, got {n} and {len(b['emitted'])}")

    def gain(i) -> float:
        return sum_ratio(a["emitted"], a["rounds"], i) - sum_ratio(b["emitted"], b["rounds"], i)

    point, lo, hi = bootstrap(gain, n)
    return round(point, 4), [round(lo, 4), round(hi, 4)]
