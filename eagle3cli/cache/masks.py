"""Chat-template tokenisation with assistant loss masks, verified per turn.

The conversation is rendered with the target's own chat template (any Jinja template, via
`model.chat.render`: reasoning and tool calls handed over the way the template reads them).
What an assistant turn trains on is what the model emits for it at serve time: the template's
rendering of the turn after its generation prompt, i.e. `render(turns[:i+1])` minus
`render(turns[:i], add_generation_prompt=True)`, up to its end-of-turn token. That text holds
the reasoning (`<think>...</think>`, harmony's analysis channel) and the tool calls the model
writes, and none of the header the prompt already holds. It is located in the render of the
whole conversation and mapped to tokens by the fast tokenizer's offsets; the special token
right after it (`<|im_end|>`, `<|eot_id|>`, `</s>`) is trained too (not for turns cut by
max_new_tokens, which the target never ended).

Templates that rewrite earlier turns (Qwen3 and gpt-oss drop the reasoning of turns before the
last user message) render such a turn differently in the whole conversation than when it was
generated. That turn then gets its own sample: the conversation up to and including it, only
it masked. The whole-conversation sample masks the turns it shows as generated.

Every masked span is checked: its tokens decode to the turn's generated text, which contains the
turn's answer, its reasoning (when the template renders reasoning at all) and its tool calls.
A template for which that fails raises `UsageError`; a template that refuses a conversation
(Jinja `raise_exception`) raises `TemplateRefusal`, which callers count as a rejected record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..model.chat import TemplateRefusal, reasoning_style, render

__all__ = [
    "MaskedSample",
    "TemplateRefusal",
    "check_template",
    "cut_turns",
    "has_assistant_output",
    "mask_conversation",
    "mask_data_record",
    "mask_record",
]


@dataclass
class MaskedSample:
    input_ids: list[int]
    loss_mask: list[bool]
    truncated: bool = False
    full_length: int = 0
    turns: list[tuple[int, int]] = field(default_factory=list)  # token spans [start, end) per masked turn
    suffix: str = ""  # "" for the whole conversation, "#t3" for turn 3's own sample


def _special_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    for tid, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(tid))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _special_texts(tokenizer, special: set[int]) -> list[str]:
    texts = {tokenizer.convert_ids_to_tokens(i) for i in special}
    return sorted((t for t in texts if isinstance(t, str) and t), key=len, reverse=True)


def _template_error(sample_id: str, what: str) -> UsageError:
    return UsageError(
        f"sample {sample_id}: the chat template breaks assistant loss masking: {what}",
        "a chat template that renders each assistant message's content verbatim (or trimmed), "
        "in order, after the generation prompt",
        "fix the tokenizer's chat_template (or the data), then rerun `eagle3 cache`; "
        "no cache is written with wrong masks",
    )


def _has_output(m: dict) -> bool:
    return bool((m.get("content") or "").strip() or m.get("tool_calls") or (m.get("reasoning_content") or "").strip())


@dataclass
class _Turn:
    index: int  # position in messages
    ordinal: int  # among assistant messages (cut_turns counts these)
    prompt: str  # render(messages[:index], add_generation_prompt=True)
    generated: str | None  # what the model emits for it (None: the template has no clean prefix)
    end_text: str | None = None  # the special token the template closes the turn with


class _Renderer:
    def __init__(self, tokenizer, tools, template_kwargs, sample_id):
        self.tok, self.tools, self.kw, self.sid = tokenizer, tools, template_kwargs, sample_id

    def __call__(self, messages: list[dict], gen: bool) -> str:
        return render(self.tok, messages, gen, self.tools, self.kw, self.sid)


def _strip_end(turn_text: str, special_texts: list[str]) -> tuple[str, str | None]:
    """(the turn's text up to its closing special token, that token). Whitespace the template puts
    after the token goes; whitespace before it is the turn's own (an answer ending in a newline)."""
    t = turn_text.rstrip()
    for s in special_texts:
        if t.endswith(s):
            return t[: -len(s)], s
    return t, None


def _turns(r: _Renderer, messages: list[dict], special_texts: list[str]) -> list[_Turn]:
    out, ordinal = [], -1
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        ordinal += 1
        if not _has_output(m):
            continue
        try:
            prompt = r(messages[:i], True) if i else ""
            alone = r(messages[: i + 1], False)
        except TemplateRefusal:  # some templates refuse a conversation that stops mid-way
            prompt, alone = "", ""
        gen, end = (
            _strip_end(alone[len(prompt) :], special_texts) if prompt and alone.startswith(prompt) else ("", None)
        )
        out.append(_Turn(i, ordinal, prompt, gen if gen.strip() else None, end))
    return out


def _locate(text: str, turn: _Turn, m: dict, cursor: int) -> tuple[int, int] | None:
    """Char span of the turn's generated text in `text`, or None when `text` renders it otherwise."""
    if turn.generated is not None:
        if turn.prompt and text.startswith(turn.prompt):
            # the whole render agrees up to this turn's generation prompt: the turn is right there or rewritten
            at = len(turn.prompt)
            return (at, at + len(turn.generated)) if text.startswith(turn.generated, at) else None
        pos = text.find(turn.generated, cursor)
        return (pos, pos + len(turn.generated)) if pos >= 0 else None
    # No clean generation prompt: find the content after where the prompt would end (legacy path).
    start = cursor
    if turn.prompt and text.startswith(turn.prompt.rstrip()):
        start = max(start, len(turn.prompt.rstrip()))
    content = m.get("content") or ""
    for candidate in (content, content.strip()):
        if candidate and (pos := text.find(candidate, start)) >= 0:
            return pos, pos + len(candidate)
    return None


def _in_context(text: str, turn: _Turn, m: dict, cursor: int) -> tuple[_Turn, tuple[int, int] | None]:
    """The turn as the whole render shows it: from its generation prompt to its end token."""
    if turn.end_text and turn.prompt and text.startswith(turn.prompt):
        at = len(turn.prompt)
        end = text.find(turn.end_text, at)
        if end > at and text[at:end].strip():
            return _Turn(turn.index, turn.ordinal, turn.prompt, text[at:end], turn.end_text), (at, end)
    legacy = _Turn(turn.index, turn.ordinal, turn.prompt, None, turn.end_text)
    return legacy, _locate(text, legacy, m, cursor)


def _advance(text: str, m: dict, cursor: int) -> int:
    """Past a message's content, so later turns are matched after it (answers may repeat questions)."""
    content = (m.get("content") or "").strip()
    pos = text.find(content, cursor) if content else -1
    return pos + len(content) if pos >= 0 else cursor


def _check_span(got: str, turn: _Turn, m: dict, sid: str, style: str) -> None:
    """What training sees as this assistant turn must be this turn: its text, answer, reasoning, calls."""
    if turn.generated is None:
        if got.strip() != (m.get("content") or "").strip():
            raise _template_error(sid, f"masked tokens decode to {got[:60]!r}, expected {m['content'][:60]!r}")
        return
    if got.strip() != turn.generated.strip():
        raise _template_error(sid, f"turn {turn.index}: masked tokens decode to {got[:60]!r}, not the turn's text")
    wanted = [(m.get("content") or "").strip()]
    if (m.get("reasoning_content") or "").strip() and style != "dropped":
        wanted.append(m["reasoning_content"].strip())
    wanted += [c["function"]["name"] for c in m.get("tool_calls") or []]
    missing = [w for w in wanted if w and w not in got]
    if missing:
        raise _template_error(sid, f"turn {turn.index}: its masked text lacks {missing[0][:40]!r}")


def _sample(
    tokenizer, text: str, spans: list[tuple[int, int, _Turn, dict]], special: set[int], cut: frozenset[int], sid, style
) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    mask = [False] * len(ids)
    token_spans = []
    t = 0
    for cs, ce, turn, m in spans:
        while t < len(ids) and offsets[t][1] <= cs:
            t += 1
        first = t
        while t < len(ids) and offsets[t][0] < ce:
            t += 1
        last = t
        if last == first:
            raise _template_error(sid, f"no token covers assistant turn {turn.index}")
        end = last < len(ids) and ids[last] in special
        for k in range(first, last + (end and turn.ordinal not in cut)):
            mask[k] = True
        token_spans.append((first, last + end))
        got = tokenizer.decode(ids[first:last], skip_special_tokens=False)
        _check_span(got, turn, m, sid, style)
        if turn.generated is None and any(i in special for i in ids[first:last]):
            raise _template_error(sid, "a special token falls inside an assistant message")
    return ids, mask, token_spans


def mask_record(
    tokenizer,
    messages: list[dict],
    max_length: int,
    sample_id: str = "?",
    special_ids: set[int] | None = None,
    cut_turns: frozenset[int] = frozenset(),
    tools: list | None = None,
    template_kwargs: dict | None = None,
) -> list[MaskedSample]:
    """Token ids and loss masks (True = assistant token to predict) for one conversation: the whole
    conversation first, then one sample per turn the whole render shows otherwise (module doc).

    `cut_turns`: assistant turns (counted among assistant messages) whose generation stopped at
    max_new_tokens: their end-of-turn token is not trained (the target never emitted it there).
    `template_kwargs`: what gen-data rendered prompts with (`enable_thinking`, `reasoning_effort`).
    """
    r = _Renderer(tokenizer, tools, template_kwargs, sample_id)
    special = special_ids if special_ids is not None else _special_ids(tokenizer)
    style = reasoning_style(tokenizer)
    turns = _turns(r, messages, _special_texts(tokenizer, special))
    text = r(messages, False)
    spans, alone, cursor, by_index = [], [], 0, {t.index: t for t in turns}
    for i, m in enumerate(messages):
        turn = by_index.get(i)
        if turn is None:
            cursor = _advance(text, m, cursor)
            continue
        found = _locate(text, turn, m, cursor)
        if found is None and turn.generated is not None:
            if (m.get("reasoning_content") or "").strip() and style != "dropped":
                # the whole render drops this turn's reasoning: train the turn where it is the last one
                alone.append((turn, m))
                cursor = _advance(text, m, max(cursor, len(turn.prompt) if text.startswith(turn.prompt) else cursor))
                continue
            # rendered otherwise later for another reason (Qwen3's empty think block of a last turn):
            # train the turn as the whole render shows it (answer and tool calls)
            turn, found = _in_context(text, turn, m, cursor)
        if found is None:
            raise _template_error(
                sample_id, f"assistant turn {i} ({(m.get('content') or '')[:40]!r}...) does not appear in the render"
            )
        spans.append((*found, turn, m))
        cursor = found[1]
    samples = []
    if spans:
        ids, mask, tspans = _sample(tokenizer, text, spans, special, cut_turns, sample_id, style)
        samples.append(MaskedSample(ids[:max_length], mask[:max_length], len(ids) > max_length, len(ids), tspans))
    for turn, m in alone:
        assert turn.generated is not None  # only turns with a clean generation prefix are trained alone
        own = turn.prompt + turn.generated
        tail = r(messages[: turn.index + 1], False)[len(own) :]  # the end-of-turn token(s)
        span = (len(turn.prompt), len(own), turn, m)
        ids, mask, tspans = _sample(tokenizer, own + tail, [span], special, cut_turns, sample_id, style)
        samples.append(
            MaskedSample(
                ids[:max_length], mask[:max_length], len(ids) > max_length, len(ids), tspans, f"#t{turn.index}"
            )
        )
    return samples


def mask_conversation(tokenizer, messages: list[dict], max_length: int, **options: Any) -> MaskedSample:
    """The whole-conversation sample of `mask_record` (every turn masked in place; `options` as
    there), for conversations whose template renders each turn as generated; a `UsageError` otherwise."""
    samples = mask_record(tokenizer, messages, max_length, **options)
    if len(samples) != 1 or samples[0].suffix:
        sid = options.get("sample_id", "?")
        raise _template_error(sid, "the template renders some turns differently later on; use mask_record")
    return samples[0]


def mask_data_record(
    tokenizer, record: dict, max_length: int, special_ids: set[int] | None = None, sample_id: str | None = None
) -> list[MaskedSample]:
    """`mask_record` for a gen-data record: its tools, the template kwargs its prompts were rendered
    with (`meta.chat_template_kwargs`) and its cut turns."""
    meta = record.get("meta") or {}
    return mask_record(
        tokenizer,
        record["messages"],
        max_length,
        sample_id if sample_id is not None else str(record.get("id", "?")),
        special_ids,
        cut_turns(record),
        record.get("tools") or None,
        meta.get("chat_template_kwargs") or None,
    )


def has_assistant_output(messages: list[dict]) -> bool:
    return any(m["role"] == "assistant" and _has_output(m) for m in messages)


def cut_turns(record: dict) -> frozenset[int]:
    """Assistant turns gen-data recorded as cut by max_new_tokens (meta.turns[i].finish_reason)."""
    turns = (record.get("meta") or {}).get("turns") or []
    return frozenset(i for i, t in enumerate(turns) if isinstance(t, dict) and t.get("finish_reason") == "length")


def check_template(tokenizer) -> None:
    """Fail fast, before any data is read, if the template cannot be masked by offsets."""
    probe = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5."},
        {"role": "user", "content": "And 2 + 4?"},
        {"role": "assistant", "content": "It is 6."},
    ]
    if not getattr(tokenizer, "is_fast", True):
        raise UsageError(
            "the target's tokenizer is a slow (Python) tokenizer without offset mapping",
            "a fast tokenizer (tokenizer.json)",
            "convert it with transformers' `AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(...)`",
        )
    samples = mask_record(tokenizer, probe, max_length=1 << 30, sample_id="template-probe")
    if sum(sum(s.loss_mask) for s in samples) == 0:
        raise _template_error("template-probe", "no assistant tokens were found")
