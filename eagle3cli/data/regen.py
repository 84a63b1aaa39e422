"""What every backend shares: sampling settings, per-turn results, and the conversation state
that regenerates assistant turns in order, each conditioned on the *regenerated* history."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..urls import redact_text


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class TurnOutput:
    text: str  # the answer (reasoning split off)
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    reasoning: str | None = None  # the thinking, when the model wrote some (<think>, analysis channel)
    tool_calls: list | None = None  # OpenAI tool calls the server parsed out of the answer
    model: str | None = None  # the model that answered (`model` in an engine's reply), for the manifest
    recounted: str | None = None  # why completion_tokens is our count, not the server's (checked_count)


def turn_seed(seed: int, record_id: str, turn: int) -> int:
    """A per-(record, turn) seed: sampled text does not depend on batch composition or order,
    so a resumed run reproduces an uninterrupted one."""
    digest = hashlib.sha256(f"{seed}\x00{record_id}\x00{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def template_kwargs_for(seed: int, record_id: str, thinking: str, efforts: tuple[str, ...]) -> dict:
    """This record's chat-template settings: `enable_thinking` (on/off, or a seeded half-half mix)
    and a `reasoning_effort` drawn from `efforts`; pure in (seed, id), so a resume agrees."""
    kw: dict = {}
    if thinking in ("on", "off"):
        kw["enable_thinking"] = thinking == "on"
    elif thinking == "mix":
        kw["enable_thinking"] = turn_seed(seed, record_id, -1) % 2 == 0
    if efforts:
        kw["reasoning_effort"] = efforts[turn_seed(seed, record_id, -2) % len(efforts)]
    return kw


def _utf8(*parts: object) -> bool:
    """Whether generated text (and tool calls) can be written as UTF-8."""
    try:
        json.dumps(parts, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Conversation:
    """One record being regenerated. Its assistant answers are slots filled in order, each
    conditioned on the regenerated history; everything else is kept: system and user turns,
    tool results, and assistant turns that call tools (their results are in the data; a tool
    cannot be run again here). A prompt-only record gets an answer slot after each user turn."""

    index: int  # position in the run's plan (output order)
    record: dict
    drop_truncated: bool = False
    template_kwargs: dict = field(default_factory=dict)  # this record's chat-template settings (thinking...)
    user_sampling: Sampling | None = None  # how the target writes user turns (`meta.write_user`, levers.py)
    user_check: Any = None  # levers.UserTurnCheck: a written user turn it refuses rejects the record
    messages: list[dict] = field(init=False)
    slots: list[int] = field(init=False)  # message indices to generate
    placeholders: set[int] = field(init=False)  # slots with no original answer
    answers: list[dict] = field(default_factory=list)  # generated assistant messages, one per filled slot
    turn_meta: list[dict] = field(default_factory=list)
    reject: tuple[str, str] | None = None
    stopped_early: bool = False
    pending: str | None = None  # a transient failure: not journaled, a rerun regenerates it
    regenerated: bool = True  # False when `keep` filled the slots with the record's own answers

    def __post_init__(self):
        msgs, self.placeholders = [], set()
        src = self.record["messages"]
        for i, m in enumerate(src):
            msgs.append(dict(m))
            if m["role"] == "user" and (i + 1 == len(src) or src[i + 1]["role"] != "assistant"):
                # an unanswered user turn (prompt-only sources, a trailing question): an answer slot
                self.placeholders.add(len(msgs))
                msgs.append({"role": "assistant", "content": ""})
        self.messages = msgs
        # user turns the target writes itself (synthetic prompts): slots too, filled in order
        self.user_slots = set(self.record.get("meta", {}).get("write_user") or ())
        self.slots = [
            i
            for i, m in enumerate(msgs)
            if (m["role"] == "assistant" and not m.get("tool_calls")) or i in self.user_slots
        ]

    @property
    def tools(self) -> list | None:
        return self.record.get("tools") or None

    @property
    def turn(self) -> int:
        return len(self.answers)

    @property
    def done(self) -> bool:
        return self.reject is not None or self.pending is not None or self.stopped_early or self.turn >= len(self.slots)

    def _filled(self, upto: int) -> list[dict]:
        """messages[:upto] with the filled slots replaced by their answers."""
        rank = {i: k for k, i in enumerate(self.slots)}
        return [self.answers[rank[i]] if i in rank else m for i, m in enumerate(self.messages[:upto])]

    def history(self) -> list[dict]:
        """Messages so far, up to the next answer slot (the prompt for the next answer)."""
        return self._filled(self.slots[self.turn])

    def seed(self, sampling: Sampling) -> int:
        return turn_seed(sampling.seed, self.record["id"], self.turn)

    @property
    def writes_user(self) -> bool:
        """The next slot is a user turn the target writes (not an answer)."""
        return not self.done and self.slots[self.turn] in self.user_slots

    def sampling(self, default: Sampling) -> Sampling:
        """This slot's sampling: a user turn's (`user_sampling`), or the answers' with the record's own
        temperature (`meta.temperature`: several answers per prompt at several temperatures)."""
        if self.writes_user and self.user_sampling is not None:
            return dataclasses.replace(self.user_sampling, seed=default.seed)
        t = self.record.get("meta", {}).get("temperature")
        return default if t is None else dataclasses.replace(default, temperature=float(t))

    def add_user(self, text: str, out: TurnOutput) -> None:
        """A user turn the target wrote: kept when `user_check` passes it, else the record is rejected."""
        why = self.user_check.reason(text, out.finish_reason) if self.user_check is not None else None
        if why is None and not text.strip():
            why = ("synth_too_short", "the target wrote an empty user turn")
        if why is None and not _utf8(text):
            why = ("invalid_unicode", "the written user turn holds a lone surrogate")
        if why is not None and any(a["role"] == "assistant" for a in self.answers):
            self.stopped_early = True  # a later user turn failed: the turns before it stand on their own
            return
        if why is not None:
            self.fail(why[0], f"user turn {self.turn}: {why[1]}")
            return
        self.answers.append({"role": "user", "content": text})
        self.turn_meta.append(
            {
                "written": "user",
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                **({"tokens_recounted": out.recounted} if out.recounted else {}),
            }
        )

    def add(self, out: TurnOutput) -> None:
        if self.writes_user:
            self.add_user(out.text, out)
            return
        if out.finish_reason == "length" and self.drop_truncated:
            # Later turns would be conditioned on a cut answer: keep the complete turns before it.
            self.stopped_early = True
            if not any(a["role"] == "assistant" for a in self.answers):
                self.reject = ("truncated", f"turn 0 hit max_new_tokens ({out.completion_tokens} tokens)")
            return
        if not out.text.strip() and not out.tool_calls:
            self.reject = ("empty_generation", f"turn {self.turn} generated no text")
            return
        if not _utf8(out.text, out.reasoning, out.tool_calls):
            # a lone surrogate ("\ud800" is valid JSON from a server) cannot be written as UTF-8:
            # the journal would fail on every rerun. Checked as inputs are.
            self.reject = ("invalid_unicode", f"turn {self.turn}: the generated answer holds a lone surrogate")
            return
        slot = self.slots[self.turn]
        answer: dict[str, Any] = {"role": "assistant", "content": out.text}
        if out.reasoning:
            answer["reasoning_content"] = out.reasoning
        if out.tool_calls:
            answer["tool_calls"] = out.tool_calls
        self.answers.append(answer)
        self.turn_meta.append(
            {
                "finish_reason": out.finish_reason,
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                **({"model": out.model} if out.model else {}),
                **({"tokens_recounted": out.recounted} if out.recounted else {}),
            }
        )
        following = self.messages[slot + 1] if slot + 1 < len(self.messages) else None
        if out.tool_calls and (following is None or following["role"] != "tool"):
            # a call whose result the data does not hold: nothing after it can be conditioned right
            self.stopped_early = True

    def keep(self, count_tokens) -> None:
        """--no-regenerate: the record's own answers fill the slots (token-counted), up to the first
        unanswered user turn."""
        self.regenerated = False
        if not self.slots or self.slots[0] in self.placeholders:
            self.fail("no_assistant_answer", "--no-regenerate keeps original answers, and this record has none")
            return
        for i in self.slots:
            if i in self.placeholders:
                self.stopped_early = True
                break
            self.answers.append(self.messages[i])
            self.turn_meta.append(
                {"finish_reason": "original", "prompt_tokens": 0, "completion_tokens": count_tokens(self.messages[i])}
            )

    def fail(self, reason: str, detail: str) -> None:
        """A content-level failure: the record is rejected for good, with the reason."""
        self.reject = (reason, redact_text(detail))

    def leave_pending(self, why: str) -> None:
        """A transient failure (endpoint down, timeouts): the partial answers are dropped and the
        conversation is regenerated from its first turn by the next run, with the same seeds."""
        self.pending = redact_text(why)

    def result(self) -> dict:
        """The output record (data contract): the conversation up to its last filled slot, so it
        ends with an assistant answer. `meta.turns` has one entry per assistant message."""
        # up to the last answer (a user turn the target wrote with no answer after it is not kept)
        msgs = self._filled(max(i for i in self.slots[: self.turn] if i not in self.user_slots) + 1)
        rank = {i: k for k, i in enumerate(self.slots)}
        turns = [
            self.turn_meta[rank[i]]
            if i in rank
            else {"finish_reason": "original", "prompt_tokens": 0, "completion_tokens": 0, "kept": "tool_call"}
            for i, m in enumerate(msgs)
            if m["role"] == "assistant"
        ]
        meta = dict(self.record.get("meta", {}))
        meta.update(
            {
                "regenerated": self.regenerated,
                "turns": turns,
                "truncated": any(t["finish_reason"] == "length" for t in turns),
                "dropped_turns": sum(1 for i in self.slots[self.turn :] if i not in self.user_slots),
            }
        )
        if self.user_slots:  # which user turns the target wrote, and what writing them cost
            meta["written_user_turns"] = [
                self.turn_meta[rank[i]] for i in sorted(self.user_slots) if rank[i] < self.turn
            ]
        if self.template_kwargs:
            meta["chat_template_kwargs"] = dict(self.template_kwargs)
        out = {"id": self.record["id"], "source": self.record["source"], "messages": msgs, "meta": meta}
        if self.tools:
            out["tools"] = self.tools
        return out

    def reject_record(self) -> dict:
        assert self.reject is not None, "reject_record() of a conversation that was not rejected"
        reason, detail = self.reject
        return {
            "source": self.record["source"],
            "row": self.record.get("meta", {}).get("row"),
            "id": self.record["id"],
            "reason": reason,
            "detail": detail,
        }


# Called once per conversation as it finishes: (conversation). Backends call it from their loop.
OnDone = Callable[[Conversation], None]
