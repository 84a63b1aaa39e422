"""More data from the prompts we have and the prompts the target can write (issue 50's levers).

Every lever is a pure function of (plan, settings, seed), applied after the mixture is planned, so
the plan, and with it resume and `plan_ids_hash`, stays a deterministic function of the inputs:

* **synthetic prompts** (Magpie-style): `--synthetic N` adds N records whose user turns the target
  writes itself, by continuing its own chat template up to where a user's text would start
  (`user_prefix`). Ids are `synthetic:i`: a written prompt has no id of its own, so records are
  planned by seed, not by text. `--synth-turns T` lets the target write the next user turn of the
  conversation too. `--synth-topics FILE` steers it towards a user's traffic (one topic or seed
  prompt per line, given to the target as a system turn while it writes, never stored).
* **several answers per prompt**: `--answers-per-prompt K` answers each planned prompt K times at
  `--answer-temperatures` (ids `ID#kJ`); identical answers are counted once at the end (`dedup.py`).
* **augmented prompts**: `--augment FILE` (YAML list of `{name, text}` style or language
  redirects) appends one seeded redirect to the first user turn of a seeded `--augment-fraction`
  of the planned records (ids `ID+NAME`).

Each written user turn is filtered as it is written (`UserTurnCheck`: length bounds, a repetition
filter, the eval-prompt check by text); near-duplicates of what the corpus already holds are
removed once every shard is written, in plan order (`dedup.py`).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from pathlib import Path

from ..config import load_yaml
from ..errors import UsageError
from ..model.chat import render

SYNTH_SOURCE = "synthetic"
SENTINEL = "\x00EAGLE3-USER-TEXT\x00"  # never in a template: marks where the user's text would start
_WORD = re.compile(r"\w+", re.UNICODE)


# ---------------------------------------------------------------- what the target continues
def user_prefix(
    tokenizer, history: list[dict], template_kwargs: dict | None = None, topic: str | None = None
) -> tuple[str, str]:
    """(the template rendered up to where the next user turn's text starts, the text the template
    writes right after a user's text: its end-of-turn marker). The target continues the first and
    its own end-of-turn (a stop token, or the marker cut off by `cut_at_end`) ends the prompt."""
    msgs = list(history)
    if topic and not any(m["role"] == "system" for m in msgs):
        # steering (Magpie's system-prompt control): seen while writing only, never stored
        msgs = [{"role": "system", "content": f"The user asks about: {topic}"}, *msgs]
    text = render(tokenizer, [*msgs, {"role": "user", "content": SENTINEL}], False, None, template_kwargs)
    head, _, tail = text.partition(SENTINEL)
    if not _:
        raise UsageError(
            "the target's chat template drops or rewrites the user's text, so the target cannot be asked to "
            "write a user turn",
            "a chat template that renders user content as given",
            "drop --synthetic / --synth-turns for this target",
        )
    return head, tail.strip()


def cut_at_end(text: str, end_marker: str) -> str:
    """The written prompt up to the template's end-of-turn marker, when the target wrote it as text."""
    if end_marker and end_marker in text:
        text = text.split(end_marker, 1)[0]
    return text.strip()


# ---------------------------------------------------------------- filters on a written user turn
@dataclasses.dataclass(frozen=True)
class UserTurnCheck:
    """Bounds on a user turn the target wrote; `reason(text, finish)` -> (reason, detail) or None."""

    min_words: int = 3
    max_words: int = 400
    min_distinct_trigrams: float = 0.5  # below: the target looped ("what is the what is the ...")
    eval_match: Callable[[dict], str | None] | None = None  # EvalIndex.match

    def reason(self, text: str, finish_reason: str) -> tuple[str, str] | None:
        words = _WORD.findall(text.casefold())
        if finish_reason == "length":
            return "synth_cut", f"the written prompt hit --synth-max-tokens ({len(words)} words)"
        if len(words) < self.min_words:
            return "synth_too_short", f"{len(words)} words, fewer than --synth-min-words {self.min_words}"
        if len(words) > self.max_words:
            return "synth_too_long", f"{len(words)} words, more than --synth-max-words {self.max_words}"
        grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
        if len(grams) >= 6 and len(set(grams)) / len(grams) < self.min_distinct_trigrams:
            share = len(set(grams)) / len(grams)
            return (
                "synth_repetitive",
                f"{share:.0%} of its word 3-grams are distinct (< {self.min_distinct_trigrams:.0%})",
            )
        if self.eval_match is not None:
            bench = self.eval_match({"messages": [{"role": "user", "content": text}]})
            if bench is not None:
                return "eval_prompt", f"the written user turn is {bench}'s text"
        return None


# ---------------------------------------------------------------- the levers, on the plan
def read_topics(path: Path, eval_match: Callable[[dict], str | None] | None) -> list[str]:
    """Steering topics, one per line (blank lines and `#` comments skipped); a topic that is an
    eval prompt is refused (it would steer the target into writing eval prompts)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise UsageError(f"--synth-topics {path} cannot be read ({e})", "a text file, one topic per line") from e
    topics = [t.strip() for t in lines if t.strip() and not t.lstrip().startswith("#")]
    if not topics:
        raise UsageError(f"--synth-topics {path} holds no topic", "one topic or seed prompt per line")
    if eval_match is not None:
        bad = [t for t in topics if eval_match({"messages": [{"role": "user", "content": t}]})]
        if bad:
            raise UsageError(
                f"--synth-topics {path}: {len(bad)} line(s) are eval prompts (first: {bad[0][:80]!r})",
                "topics that describe your traffic, never the benches eval measures on",
                "remove those lines",
            )
    return topics


def synthetic_records(n: int, turns: int, seed: int, topics: list[str] | None) -> list[dict]:
    """N records whose user turns the target writes (`meta.write_user`: the message indices)."""
    out = []
    for i in range(n):
        msgs: list[dict] = []
        for _ in range(turns):
            msgs += [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
        meta: dict = {"row": i, "write_user": [2 * t for t in range(turns)]}
        if topics:
            meta["topic"] = topics[random.Random(f"{seed}:topic:{i}").randrange(len(topics))]
        out.append({"id": f"{SYNTH_SOURCE}:{i}", "source": SYNTH_SOURCE, "messages": msgs, "meta": meta})
    return out


def read_augmentations(path: Path) -> list[dict]:
    """`augmentations: [{name, text}, ...]` from a YAML file (names key the record ids)."""
    try:  # the recipe loader's bounds (size, aliases, no device or FIFO hang)
        data = load_yaml(path, "--augment", "give a YAML file with `augmentations: [{name, text}, ...]`")
    except OSError as e:
        raise UsageError(f"--augment {path} cannot be read ({e})", "a YAML file with `augmentations:`") from e
    items = data.get("augmentations") if isinstance(data, dict) else None
    ok = (
        isinstance(items, list)
        and items
        and all(
            isinstance(a, dict)
            and isinstance(a.get("name"), str)
            and re.fullmatch(r"[a-z0-9_-]+", a["name"])
            and isinstance(a.get("text"), str)
            and a["text"].strip()
            for a in items
        )
    )
    if not ok or items is None:
        raise UsageError(
            f"--augment {path}: not a list of redirects",
            "augmentations: [{name: fr, text: 'Answer in French.'}, ...] (names: a-z, 0-9, _ and -)",
            "see recipes/smollm2-135m/augmentations.yaml",
        )
    names = [a["name"] for a in items]
    if len(set(names)) != len(names):
        raise UsageError(f"--augment {path}: names repeat", "one name per redirect (it keys the record ids)")
    return [{"name": a["name"], "text": a["text"].strip()} for a in items]


def augment(plan: list[dict], augs: list[dict], fraction: float, seed: int) -> list[dict]:
    """A seeded `fraction` of the records with one seeded redirect appended to the first user turn."""
    out = []
    for r in plan:
        rng = random.Random(f"{seed}:augment:{r['id']}")
        if rng.random() >= fraction:
            out.append(r)
            continue
        a = augs[rng.randrange(len(augs))]
        msgs = [dict(m) for m in r["messages"]]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        msgs[first]["content"] = f"{msgs[first]['content'].rstrip()}\n\n{a['text']}"
        meta = {**r["meta"], "augmentation": a["name"], "augmented_from": r["id"]}
        out.append({**r, "id": f"{r['id']}+{a['name']}", "messages": msgs, "meta": meta})
    return out


def several_answers(plan: list[dict], k: int, temperatures: tuple[float, ...]) -> list[dict]:
    """Each record K times (`ID#kJ`), answer J sampled at temperatures[J] (one value: all of them)."""
    if k <= 1 and len(temperatures) <= 1:
        if temperatures:
            return [{**r, "meta": {**r["meta"], "temperature": temperatures[0]}} for r in plan]
        return plan
    temps = temperatures * k if len(temperatures) == 1 else temperatures
    return [
        {**r, "id": f"{r['id']}#k{j}", "meta": {**r["meta"], "temperature": temps[j], "answer_group": r["id"]}}
        for r in plan
        for j in range(k)
    ]
