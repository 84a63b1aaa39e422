"""What every backend shares: sampling settings, per-turn results, and the conversation state
that regenerates assistant turns in order, each conditioned on the *regenerated* history."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

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
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int


def turn_seed(seed: int, record_id: str, turn: int) -> int:
    """A per-(record, turn) seed: sampled text does not depend on batch composition or order,
    so a resumed run reproduces an uninterrupted one."""
    digest = hashlib.sha256(f"{seed}\x00{record_id}\x00{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class Conversation:
    """One record being regenerated: system prompt + user turns; answers are appended in order."""

    index: int  # position in the run's plan (output order)
    record: dict
    drop_truncated: bool = False
    system: list[dict] = field(init=False)
    users: list[str] = field(init=False)
    answers: list[str] = field(default_factory=list)
    turn_meta: list[dict] = field(default_factory=list)
    reject: tuple[str, str] | None = None
    stopped_early: bool = False
    pending: str | None = None  # a transient failure: not journaled, a rerun regenerates it

    def __post_init__(self):
        msgs = self.record["messages"]
        self.system = [m for m in msgs[:1] if m["role"] == "system"]
        self.users = [m["content"] for m in msgs if m["role"] == "user"]

    @property
    def turn(self) -> int:
        return len(self.answers)

    @property
    def done(self) -> bool:
        return self.reject is not None or self.pending is not None or self.stopped_early or self.turn >= len(self.users)

    def history(self) -> list[dict]:
        """Messages so far, ending with the next user turn (the prompt for the next answer)."""
        msgs = list(self.system)
        for u, a in zip(self.users, self.answers):
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        return msgs + [{"role": "user", "content": self.users[self.turn]}]

    def seed(self, sampling: Sampling) -> int:
        return turn_seed(sampling.seed, self.record["id"], self.turn)

    def add(self, out: TurnOutput) -> None:
        if out.finish_reason == "length" and self.drop_truncated:
            # Later turns would be conditioned on a cut answer: keep the complete turns before it.
            self.stopped_early = True
            if not self.answers:
                self.reject = ("truncated", f"turn 0 hit max_new_tokens ({out.completion_tokens} tokens)")
            return
        if not out.text.strip():
            self.reject = ("empty_generation", f"turn {self.turn} generated no text")
            return
        self.answers.append(out.text)
        self.turn_meta.append(
            {
                "finish_reason": out.finish_reason,
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
            }
        )

    def fail(self, reason: str, detail: str) -> None:
        """A content-level failure: the record is rejected for good, with the reason."""
        self.reject = (reason, redact_text(detail))

    def leave_pending(self, why: str) -> None:
        """A transient failure (endpoint down, timeouts): the partial answers are dropped and the
        conversation is regenerated from its first turn by the next run, with the same seeds."""
        self.pending = redact_text(why)

    def result(self) -> dict:
        """The output record (data contract): messages alternate and end with an assistant turn."""
        msgs = list(self.system)
        for u, a in zip(self.users, self.answers):
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        meta = dict(self.record.get("meta", {}))
        meta.update(
            {
                "regenerated": True,
                "turns": self.turn_meta,
                "truncated": any(t["finish_reason"] == "length" for t in self.turn_meta),
                "dropped_turns": len(self.users) - len(self.answers),
            }
        )
        return {"id": self.record["id"], "source": self.record["source"], "messages": msgs, "meta": meta}

    def reject_record(self) -> dict:
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
