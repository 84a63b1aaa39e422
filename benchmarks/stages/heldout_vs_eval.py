"""The learning curve's held-out estimate of a finished head next to `eagle3 eval`'s measurement.

    .venv/bin/python benchmarks/stages/heldout_vs_eval.py --run runs/tiny-heldout --eval runs/tiny-heldout/eval

Rebuilds the run's trainer from its train manifest (the final checkpoint, the same held-out
conversations), measures the held-out greedy-chain tau at the eval's depth with the current
estimator, and prints it beside the eval report's chain tau and alpha_k as one JSON object.
The two see different text (cached held-out conversations of the training distribution vs the
bench's prompts, decoded), so they agree only as far as the distributions do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root
from eagle3cli.config import build_config  # noqa: E402
from eagle3cli.train.config import TrainConfig  # noqa: E402
from eagle3cli.train.loop import measure_heldout  # noqa: E402
from eagle3cli.train.setup import setup  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--eval", type=Path, required=True, help="an eval folder of this run's head (report.json)")
    a = ap.parse_args()
    report = json.loads((a.eval / "report.json").read_text())
    chain = next(iter(report["heads"].values()))["chain"]["acceptance"]
    config = json.loads((a.run / "train" / "manifest.json").read_text())["config"]
    known = {k: v for k, v in config.items() if k in TrainConfig.__dataclass_fields__ and v is not None}
    cfg = build_config(TrainConfig, None, "train", **{**known, "heldout_depth": report["depth"]})
    tr = setup(cfg)  # resumes: the final checkpoint
    point = measure_heldout(tr)
    alpha = [None if d["alpha"] is None else round(d["alpha"], 4) for d in chain["per_depth"]]
    print(
        json.dumps(
            {
                "run": str(a.run),
                "heldout": {
                    "tau": point["heldout_tau"],
                    "alpha_k": point["heldout_alpha_k"],
                    "samples": point["heldout_samples"],
                },
                "eval": {
                    "bench": report["bench"],
                    "prompts": report["num_prompts"],
                    "tau": round(chain["tau"], 4),
                    "alpha_k": alpha,
                },
                "heldout_over_eval": round(point["heldout_tau"] / chain["tau"], 3),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
