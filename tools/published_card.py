"""The published SmolLM2 head's model card, models/smollm2-135m-eagle3/README.md, rendered by
eagle3cli/head/card.py from what the repository keeps of it: the head's config.json and manifest.json,
the corpora's gen-data manifests, and docs/results-smollm2.json (the sessions that trained it and the
page's evals of it, with the commands run_bench.py ran them with). Its run folders are gone, so the
trail and the recipe come from the page rather than from runs/.

    .venv/bin/python tools/published_card.py           # write the card
    .venv/bin/python tools/published_card.py --check   # exit 1 if the committed card differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: the repo root, for `benchmarks` and `eagle3cli`
from benchmarks.common import Recorder  # noqa: E402
from benchmarks.smollm2.run_bench import eval_cmd, eval_plan  # noqa: E402
from eagle3cli.head.card import CARD, read_object, render  # noqa: E402

HEAD = Path("models/smollm2-135m-eagle3")
LICENSE = "apache-2.0"  # SmolLM2-135M-Instruct's; the corpora's sources are MIT (GSM8K) and ShareGPT's terms
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# the page's evals of the published head (run_bench.eval_plan names); bf16's row is a speed check of
# the same bench and mode as mt_bench's fp32 one, which the card keeps
EVALS = ("mt_bench", "mt_bench_tree", "mt_bench_both_turns", "mt_bench_t1", "gsm8k", "humaneval", "sharegpt_heldout")
SIZES = argparse.Namespace(
    mt_bench_prompts=80, eval_prompts=40, max_new_tokens=64, sampling_prompts=20, sweep_prompts=8, threads=1
)


def eval_rows(page: dict) -> list[dict]:
    run = Path(page["published"]["run"])
    plan = eval_plan(run, run, run, SIZES)
    rows = []
    for r in page["rows"]:
        if r.get("head") != f"{run.name}/head" or r["eval"] not in EVALS:
            continue
        _, bench, prompts, extra = plan[r["eval"]]
        rows.append(
            {
                "bench": r["bench"],
                "mode": r["decoder"],
                "turns": r["turns"],
                "temperature": r["temperature"],
                "depth": r["depth"],
                "prompts": r["prompts"],
                "max_new_tokens": SIZES.max_new_tokens,
                "tau": r["tau"],
                "tau_interval": [round(x, 3) for x in r.get("tau_interval") or []],
                "alpha_by_depth": [None if a is None else round(a, 3) for a in r.get("alpha_k") or []],
                "speedup_vs_plain": r["speedup_vs_plain"],
                "greedy_mismatches": r["greedy_mismatches"],
                "command": Recorder().show(eval_cmd(run, run / f"eval-{r['eval']}", bench, prompts, SIZES, *extra)),
            }
        )
    return rows


def trail(page: dict) -> dict:
    """The trail the run folders would give: the corpora the sessions read, what the sessions trained."""
    pub = page["published"]
    folders = list(
        dict.fromkeys([s["data"] for s in pub["sessions"]] + [e["folder"] for s in pub["sessions"] for e in s["extra"]])
    )
    sessions = pub["sessions"]
    main = sum(s["samples"][1] - s["samples"][0] + 1 for s in sessions)
    extra = [f"{e['samples']} of {e['folder']} in {s['run']}" for s in sessions for e in s["extra"]]
    train = {
        "trained_samples": f"{main} samples of {sessions[0]['data']}" + (f" + {', '.join(extra)}" if extra else ""),
        "trained_sample_tokens": pub["trained_tokens"],
        "steps": sum(s["steps"] for s in sessions),
        "tokens_seen": pub["trained_tokens"],
        "stopped": f"{len(sessions)} sessions, the last: {sessions[-1]['stopped']}",
    }
    return {
        "train": train,
        "cache": None,
        "data": [(f, read_object(REPO / f / "manifest.json")) for f in folders],
        "exports": [read_object(REPO / HEAD / "manifest.json")],
    }


def recipe(page: dict) -> list[str]:
    lines = [
        "Trained online across sessions, each from the last one's head on conversations it had not seen "
        "(`recipes/smollm2-135m/train-online.yaml`, `--init-head` and `--skip-samples`: docs/train.md):",
        "",
        "| run | started from | samples | extra | steps | new tokens | held-out tau |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in page["published"]["sessions"]:
        extra = ", ".join(f"{e['samples']} of {e['folder']}" for e in s["extra"]) or "-"
        lines.append(
            f"| {s['run']} | {s['init_head']} | {s['samples'][0]}-{s['samples'][1]} of {s['data']} | {extra} | "
            f"{s['steps']} | {s['tokens']} | {s['heldout_start']} -> {s['heldout_end']} |"
        )
    return lines


def card_text() -> str:
    page = json.loads((REPO / "docs" / "results-smollm2.json").read_text())
    # the target folder is built by `make smollm2` from a GGUF: the hub id is the model it was converted from
    return render(HEAD, eval_rows(page), LICENSE, trail(page), recipe(page), BASE_MODEL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the committed card instead of writing it")
    a = ap.parse_args()
    import os

    os.chdir(REPO)  # the card names repository paths
    text, path = card_text(), REPO / HEAD / CARD
    if a.check:
        same = path.is_file() and path.read_text() == text
        print("up to date" if same else f"{path} differs from what tools/published_card.py renders: run it")
        raise SystemExit(0 if same else 1)
    from eagle3cli.run_folder.manifest import atomic_write_text

    atomic_write_text(path, text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
