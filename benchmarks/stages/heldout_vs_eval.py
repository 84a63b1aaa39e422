"""The learning curve's held-out estimate of a finished head next to `eagle3 eval`'s measurement.

    .venv/bin/python benchmarks/stages/heldout_vs_eval.py --run runs/tiny-heldout --eval runs/tiny-heldout/eval

Rebuilds the run's trainer from its train manifest (the final checkpoint, the same held-out
conversations), measures the held-out greedy-chain tau at the eval's depth with the current
estimator, and prints it beside the eval report's chain tau and alpha_k as one JSON object.
The two see different text (cached held-out conversations of the training distribution vs the
bench's prompts, decoded), so they agree only as far as the distributions do.

`--explain` also scores the held-out conversations on parts of their answers, to say where
a gap comes from: the first N tokens of each answer and of the first answer only (what an eval
of first turns with --max-new-tokens N decodes), and the answers without their repeats (tokens whose preceding 16-gram already
occurred earlier in the sample: a small target's greedy regeneration loops, and a draft copies
a loop almost for free).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo root
from eagle3cli.config import build_config  # noqa: E402
from eagle3cli.train.config import TrainConfig, upgrade_recorded  # noqa: E402
from eagle3cli.train.heldout import heldout_acceptance  # noqa: E402
from eagle3cli.train.loop import measure_heldout, teacher_for  # noqa: E402
from eagle3cli.train.setup import setup  # noqa: E402

REPEAT_NGRAM = 16


def answer_prefix(loss_mask: torch.Tensor, n: int, answers: int | None = None) -> torch.Tensor:
    """[B, T] loss_mask keeping only the first n tokens of each assistant span (of the first
    `answers` spans of each row; None: all)."""
    out = torch.zeros_like(loss_mask)
    for b, row in enumerate(loss_mask.tolist()):
        run = spans = 0
        for t, m in enumerate(row):
            run = run + 1 if m else 0
            spans += run == 1
            out[b, t] = bool(m) and run <= n and (answers is None or spans <= answers)
    return out


def repeats(input_ids: torch.Tensor, n: int = REPEAT_NGRAM) -> torch.Tensor:
    """[B, T] True at t when the n tokens ending at t already occurred, ending earlier, in the row."""
    out = torch.zeros(input_ids.shape, dtype=torch.bool)
    for b, row in enumerate(input_ids.tolist()):
        seen: set[tuple[int, ...]] = set()
        for t in range(n - 1, len(row)):
            gram = tuple(row[t - n + 1 : t + 1])
            out[b, t] = gram in seen
            seen.add(gram)
    return out


class MaskedSource:
    """The trainer's source with each batch's loss mask narrowed by `narrow(batch) -> mask`."""

    def __init__(self, source, narrow):
        self.source, self.narrow, self.lengths = source, narrow, source.lengths

    def batch(self, indices, max_length):
        b = self.source.batch(indices, max_length)
        b["loss_mask"] = self.narrow(b)
        return b


def explain(tr, prefix: int) -> dict:
    """Held-out tau on the whole answers, their first `prefix` tokens, and without repeats."""
    source, depth, out = tr.source, tr.cfg.heldout_depth, {}
    counted = {"masked": 0, "repeats": 0}

    def no_repeats(b):
        rep = repeats(b["input_ids"]) & b["loss_mask"].bool()
        counted["masked"] += int(b["loss_mask"].sum())
        counted["repeats"] += int(rep.sum())
        return b["loss_mask"] & ~rep

    parts = {
        "whole answers": None,
        f"first {prefix} tokens of each answer": lambda b: answer_prefix(b["loss_mask"], prefix),
        f"first {prefix} tokens of the first answer": lambda b: answer_prefix(b["loss_mask"], prefix, answers=1),
        "answers without repeats": no_repeats,
    }
    for name, narrow in parts.items():
        tr.source = source if narrow is None else MaskedSource(source, narrow)
        try:
            h = heldout_acceptance(tr, tr.heldout, depth, teacher_for)
        finally:
            tr.source = source
        out[name] = {"tau": h["tau"], "alpha_k": h["alpha_k"], "rounds": h["anchors"]}
    out["repeat_share_of_answer_tokens"] = round(counted["repeats"] / max(counted["masked"], 1), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--eval", type=Path, required=True, help="an eval folder of this run's head (report.json)")
    ap.add_argument("--explain", action="store_true", help="also score answer prefixes and answers without repeats")
    a = ap.parse_args()
    report = json.loads((a.eval / "report.json").read_text())
    chain = next(iter(report["heads"].values()))["chain"]["acceptance"]
    config = upgrade_recorded(json.loads((a.run / "train" / "manifest.json").read_text())["config"])
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
                **({"explain": explain(tr, report["max_new_tokens"])} if a.explain else {}),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
