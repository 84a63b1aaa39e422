"""How large a draft vocabulary the data needs: coverage of the trained (assistant) tokens.

    .venv/bin/python benchmarks/smollm2/vocab_coverage.py --run runs/smollm2 [--sizes 4096,8192,16384,32000]

The draft vocab is the most frequent masked tokens of the training data (speculate/vocab.py). What
matters at decode time is coverage of text the head has not seen, so the vocab is chosen on 90%
of the conversations (split by a hash of the record id) and its coverage measured on the other
10%, beside the in-sample coverage. Tokenised with the cache's own chat-template masks.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch

from eagle3cli.cache.masks import mask_data_record
from eagle3cli.model.target import load_tokenizer
from eagle3cli.speculate.vocab import build_mapping, coverage, select_draft_tokens, token_counts
from eagle3cli.train.data import read_conversations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--target", type=Path, default=Path("models/smollm2-135m"))
    ap.add_argument("--sizes", default="2048,4096,8192,16384,32000")
    ap.add_argument("--max-length", type=int, default=2048)
    a = ap.parse_args()
    tok = load_tokenizer(a.target)
    vocab = len(tok)
    fit, held = [], []
    for r in read_conversations(a.run / "data"):
        held_out = hashlib.sha256(r["id"].encode()).digest()[0] < 26  # ~10%
        for m in mask_data_record(tok, r, a.max_length):  # exactly the tokens the cache trains
            (held if held_out else fit).append((m.input_ids, m.loss_mask))
    c_fit, c_held = token_counts(fit, vocab), token_counts(held, vocab)
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        if n > vocab:
            continue
        _, t2d = build_mapping(select_draft_tokens(c_fit, n), vocab)
        rows.append(
            {"draft_vocab": n, "in_sample": round(coverage(c_fit, t2d), 4), "held_out": round(coverage(c_held, t2d), 4)}
        )
    print(
        json.dumps(
            {
                "conversations": {"fit": len(fit), "held_out": len(held)},
                "trained_tokens": {"fit": int(c_fit.sum()), "held_out": int(c_held.sum())},
                "distinct_tokens_fit": int((c_fit > 0).sum()),
                "target_vocab": vocab,
                "coverage": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
