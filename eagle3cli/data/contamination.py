"""Eval prompts never enter a training corpus: a check by text, not by id.

ShareGPT holds many copies of one conversation under different ids, and benchmark questions are
pasted into chats, so the held-out split by id hash (readers/sources.py) is not enough. A training record
is rejected (`eval_prompt`) when one of its user turns

* equals, after normalising case, punctuation and whitespace, a user turn of an eval bench of
  at least `MIN_WORDS` words ("continue", "go on" are everyone's turns, not a bench's), or
* contains most of one: at least half of the eval turn's runs of `NGRAM` words (the 13-gram
  overlap of GPT-3's contamination study, made proportional: a shared boilerplate paragraph,
  such as a web-search plugin's instructions, is not the question that follows it).

Measured on ShareGPT V3 (17,275 rows) against the four benches: one shared 13-gram flagged 1,430
conversations, most for "continue"-like turns and plugin boilerplate; this rule flags the copies.

The benches are the ones `eagle3 eval --bench` reads: MT-bench (both turns), GSM8K test,
HumanEval and ShareGPT's held-out split; a bench whose package is not installed is skipped and
named in the manifest, so a corpus made without it says so.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from ..errors import UsageError
from .formats import parse_input_spec, read_input, reject_row

EVAL_BENCHES = ("mt_bench:test", "gsm8k:test", "humaneval:test", "sharegpt:test")
NGRAM = 13
MIN_WORDS = 4
MIN_SHARE = 0.5
_WORD = re.compile(r"\w+", re.UNICODE)


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def _ngrams(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def _user_texts(record: dict) -> list[str]:
    return [m["content"] for m in record["messages"] if m["role"] == "user" and isinstance(m.get("content"), str)]


@dataclass
class EvalIndex:
    """Every eval bench's user turns, as whole texts and as word 13-grams."""

    whole: dict[tuple[str, ...], str] = field(default_factory=dict)  # words -> bench
    grams: dict[tuple[str, ...], list[int]] = field(default_factory=dict)  # 13-gram -> eval turns holding it
    turns: list[tuple[str, int]] = field(default_factory=list)  # eval turn -> (bench, its 13-grams)
    benches: dict[str, int] = field(default_factory=dict)  # bench -> turns indexed
    missing: dict[str, str] = field(default_factory=dict)  # bench -> why it was skipped

    def add(self, bench: str, text: str) -> None:
        words = _words(text)
        if len(words) < MIN_WORDS:
            return
        self.whole.setdefault(tuple(words), bench)
        grams = _ngrams(words)
        if not grams:
            return
        i = len(self.turns)
        self.turns.append((bench, len(grams)))
        for g in grams:
            self.grams.setdefault(g, []).append(i)

    def match(self, record: dict) -> str | None:
        """The bench a record's user turn comes from, or None."""
        for text in _user_texts(record):
            words = _words(text)
            if tuple(words) in self.whole:
                return self.whole[tuple(words)]
            hits: dict[int, int] = {}
            for g in _ngrams(words):
                for i in self.grams.get(g, ()):
                    hits[i] = hits.get(i, 0) + 1
            for i, n in hits.items():
                bench, total = self.turns[i]
                if n >= MIN_SHARE * total:
                    return bench
        return None

    def summary(self) -> dict:
        return {
            "rule": f"equal (>= {MIN_WORDS} words) or >= {MIN_SHARE:.0%} of an eval turn's {NGRAM}-word runs",
            "benches": dict(self.benches),
            "not_installed": dict(self.missing),
        }


@functools.lru_cache(maxsize=4)  # read once per process (ShareGPT's held-out split takes ~3 s to parse)
def eval_index(benches: tuple[str, ...] = EVAL_BENCHES) -> EvalIndex:
    idx = EvalIndex()
    for bench in benches:
        try:
            result = read_input(parse_input_spec(bench, default_split="test"))
        except UsageError as e:  # a bench whose package is absent cannot leak into anything read here
            idx.missing[bench] = e.what
            continue
        n = 0
        for rec in result.records:
            for text in _user_texts(rec):
                idx.add(bench, text)
                n += 1
        idx.benches[bench] = n
    return idx


def eval_reject(idx: EvalIndex, record: dict) -> dict | None:
    """The reject row for a record whose user turn comes from an eval bench, else None."""
    bench = idx.match(record)
    if bench is None:
        return None
    return reject_row(
        record["source"], record["meta"]["row"], "eval_prompt", f"a user turn is {bench}'s text", record["id"]
    )


def drop_eval_prompts(records: list[dict], idx: EvalIndex) -> tuple[list[dict], list[dict]]:
    """(kept records, rejects for the ones whose user turns come from an eval bench)."""
    kept, rejects = [], []
    for r in records:
        why = eval_reject(idx, r)
        if why is None:
            kept.append(r)
        else:
            rejects.append(why)
    return kept, rejects
