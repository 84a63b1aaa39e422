"""Rendering conversations with the target's chat template: reasoning, tool calls, refusals.

eagle3's message schema (what gen-data writes and cache reads):
  {"role": "system" | "user" | "assistant" | "tool", "content": str,
   "reasoning_content": str (assistant, optional: the model's thinking),
   "tool_calls": [{"type": "function", "function": {"name": str, "arguments": {...}}}] (assistant, optional),
   "tool_call_id": str, "name": str (tool, optional)}
plus, per record, optional `tools` (OpenAI function schemas) and
`meta.chat_template_kwargs` (e.g. {"enable_thinking": false}, {"reasoning_effort": "high"}).

Templates read reasoning in different places: Qwen3's reads `reasoning_content` (or inline
`<think>` in the content), gpt-oss's reads `thinking`, DeepSeek-R1 distills only inline text.
`reasoning_style` finds out by rendering a probe once per template, and `render` hands the
reasoning to the template the way it reads it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import threading
from collections.abc import Iterator

from ..errors import UsageError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_PROBE = "eagle3-reasoning-probe-7f3a"


class TemplateRefusal(UsageError):
    """The chat template raised (Jinja `raise_exception`), e.g. Gemma-2's "System role not supported".
    A property of one conversation, not of the run: callers reject the record with `reason`."""

    reason = "template_refused"

    def __init__(self, message: str, sample_id: str = "?"):
        self.message = message
        super().__init__(
            f"sample {sample_id}: the target's chat template refuses this conversation: {message}",
            "conversations the target's template accepts (some templates allow no system turn, or need "
            "strictly alternating user/assistant turns)",
            "fix or filter the data (eagle3 gen-data ...), or use a template that accepts it",
        )


def _call_template(tokenizer, messages: list[dict], add_generation_prompt: bool, tools, kwargs: dict) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


_STYLES: dict[str, str] = {}


def reasoning_style(tokenizer) -> str:
    """Where this template reads an assistant turn's reasoning: `reasoning_content`, `thinking`,
    `inline` (as `<think>...</think>` at the start of the content), or `dropped` (a template that
    never renders reasoning, such as DeepSeek-R1 distills'). Probed once per template, on a
    conversation whose last turn carries the reasoning (templates keep it there if anywhere)."""
    key = str(getattr(tokenizer, "chat_template", ""))
    if key not in _STYLES:
        _STYLES[key] = "dropped"
        for style in ("reasoning_content", "thinking", "inline"):
            msgs = template_messages(
                [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": _PROBE}],
                style,
            )
            try:
                if _PROBE in _call_template(tokenizer, msgs, False, None, {}):
                    _STYLES[key] = style
                    break
            except TemplateTooSlow:
                raise  # the time limit ends the rendering, not just this probe
            except Exception:  # noqa: BLE001 — a template that rejects the probe reads no such field
                continue
    return _STYLES[key]


def _arguments(args):
    """Tool-call arguments as a mapping (templates such as Llama 3.1's `tojson` them; a JSON string
    would be encoded twice)."""
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            return args
        return parsed if isinstance(parsed, dict) else args
    return args


def template_messages(messages: list[dict], style: str) -> list[dict]:
    """eagle3 messages -> what `apply_chat_template` gets, reasoning placed where the template reads it."""
    out = []
    for m in messages:
        t = {"role": m["role"], "content": m.get("content") or ""}
        for k in ("tool_call_id", "name"):
            if m.get(k) is not None:
                t[k] = m[k]
        if m.get("tool_calls"):
            t["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
                for c in m["tool_calls"]
            ]
        reasoning = m.get("reasoning_content")
        if m["role"] == "assistant" and isinstance(reasoning, str) and reasoning:
            if style in ("inline", "dropped"):
                t["content"] = f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n\n{t['content'].lstrip()}"
            else:
                t[style] = reasoning
        out.append(t)
    return out


def render(
    tokenizer,
    messages: list[dict],
    add_generation_prompt: bool = False,
    tools: list | None = None,
    template_kwargs: dict | None = None,
    sample_id: str = "?",
) -> str:
    """The conversation as the target's template renders it; `TemplateRefusal` when it raises."""
    seconds = template_seconds()  # a bad EAGLE3_TEMPLATE_SECONDS is the run's error, not this record's
    try:
        with _time_limit(seconds):  # reasoning_style renders the template too
            msgs = template_messages(messages, reasoning_style(tokenizer))
            return _call_template(tokenizer, msgs, add_generation_prompt, tools, dict(template_kwargs or {}))
    except Exception as e:  # noqa: BLE001 — Jinja raise_exception(), a template error on this data, or too slow
        raise TemplateRefusal(f"{type(e).__name__}: {e}", sample_id) from e


TEMPLATE_SECONDS_ENV = "EAGLE3_TEMPLATE_SECONDS"


def template_seconds() -> float:
    """How long one rendering may take (a template is code from the model folder: a loop in it must
    cost one rejected record, not the run). 10 s; EAGLE3_TEMPLATE_SECONDS changes it."""
    raw = os.environ.get(TEMPLATE_SECONDS_ENV, "10")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    # inf made the alarm fail on every record (each one "refused"); nan, 0 and negatives meant nothing
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(
            f"{TEMPLATE_SECONDS_ENV}={raw!r} is not a time limit",
            "seconds > 0, finite (default 10)",
            f"unset {TEMPLATE_SECONDS_ENV} or set it to e.g. 30",
        )
    return max(0.01, seconds)


class TemplateTooSlow(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds` raises TemplateTooSlow inside the rendering (main thread only: signals
    reach no other; a rendering from a worker thread runs unbounded)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(_signum, _frame):
        raise TemplateTooSlow(f"the chat template ran longer than {seconds:g} s ({TEMPLATE_SECONDS_ENV})")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_HARMONY = re.compile(
    r"<\|channel\|>(\w+)(?:(?!<\|message\|>).)*<\|message\|>(.*?)(?=<\|end\|>|<\|return\|>|<\|call\|>|<\|start\|>|$)",
    re.S,
)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a generated turn: `<think>R</think>A`, or harmony channels
    (`analysis` -> reasoning, `final` -> answer). Text without either is all answer."""
    if "<|channel|>" in text:
        parts = _HARMONY.findall(text)
        if parts:
            reasoning = "".join(body for ch, body in parts if ch == "analysis").strip() or None
            answer = "".join(body for ch, body in parts if ch != "analysis")
            return reasoning, answer.strip()
    if THINK_CLOSE in text:
        head, _, answer = text.partition(THINK_CLOSE)
        head = head.split(THINK_OPEN, 1)[-1]
        return head.strip("\n") or None, answer.lstrip("\n")
    return None, text
