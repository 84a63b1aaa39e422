"""Chat-template tokenisation with assistant loss masks, found by character offsets.

The conversation is rendered with the target's own chat template (any Jinja template). Each
assistant turn's content is located in the rendered string: its search starts where the
template's generation prompt ends (the render of the turns before it with
`add_generation_prompt=True`), so header text such as "assistant" is never mistaken for
content. The char span maps to tokens through the fast tokenizer's offset mapping; the
special token the template puts right after the content (`<|im_end|>`, `<|eot_id|>`,
`</s>`) is trainable too, because the draft must learn to propose the end of a turn.

Every sample is self-checked: the decoded masked tokens must equal the assistant texts
plus end tokens. A template for which that fails raises `UsageError` instead of producing
silent all-zero (or shifted) masks, the classic failure of header-string matching.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError


@dataclass
class MaskedSample:
    input_ids: list[int]
    loss_mask: list[bool]
    truncated: bool = False
    full_length: int = 0
    turns: list[tuple[int, int]] = field(default_factory=list)  # token spans [start, end) per assistant turn


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def _special_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    for tid, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(tid))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _template_error(sample_id: str, what: str) -> UsageError:
    return UsageError(
        f"sample {sample_id}: the chat template breaks assistant loss masking: {what}",
        "a chat template that renders each assistant message's content verbatim (or trimmed), "
        "in order, after the generation prompt",
        "fix the tokenizer's chat_template (or the data), then rerun `eagle3 cache`; "
        "no cache is written with wrong masks",
    )


def char_spans(tokenizer, messages: list[dict], sample_id: str = "?") -> tuple[str, list[tuple[int, int, str]]]:
    """(rendered text, [(char_start, char_end, content_as_rendered)] per non-empty assistant turn)."""
    try:
        text = _render(tokenizer, messages, add_generation_prompt=False)
    except Exception as e:  # noqa: BLE001 — Jinja raise_exception(), e.g. "roles must alternate"
        raise UsageError(
            f"sample {sample_id}: the target's chat template refuses this conversation: {type(e).__name__}: {e}",
            "conversations the target's template accepts (some templates allow no system turn, or need "
            "strictly alternating user/assistant turns)",
            "fix or filter the data (eagle3 gen-data ...), or use a template that accepts it",
        ) from e
    spans = []
    cursor = 0
    for i, m in enumerate(messages):
        content = m["content"]
        if m["role"] != "assistant":
            # Advance past non-assistant content so an assistant answer that repeats the
            # question is matched at its own place.
            pos = text.find(content, cursor) if content else -1
            if pos >= 0:
                cursor = pos + len(content)
            continue
        if not content.strip():
            continue
        start = cursor
        # Where the generation prompt ends is where the model starts to speak. Templates whose
        # earlier-turn rendering differs from the prefix render (e.g. thinking removed) are
        # still handled: the bound is used only when the prefix render is a prefix of the text.
        try:
            prompt = _render(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        except Exception:  # noqa: BLE001 — some templates refuse a conversation that ends mid-way
            prompt = ""
        if prompt and text.startswith(prompt):
            start = max(start, len(prompt))
        elif prompt:
            # The prompt may end in whitespace the full render replaces by the content's start.
            stripped = prompt.rstrip()
            if text.startswith(stripped):
                start = max(start, len(stripped))
        found = None
        for candidate in (content, content.strip()):
            pos = text.find(candidate, start)
            if pos >= 0:
                found = (pos, pos + len(candidate), candidate)
                break
        if found is None:
            raise _template_error(sample_id, f"assistant turn {i} ({content[:40]!r}...) does not appear in the render")
        spans.append(found)
        cursor = found[1]
    return text, spans


def mask_conversation(
    tokenizer,
    messages: list[dict],
    max_length: int,
    sample_id: str = "?",
    special_ids: set[int] | None = None,
    cut_turns: frozenset[int] = frozenset(),
) -> MaskedSample:
    """Token ids and a loss mask (True = assistant token to predict) for one conversation.

    `cut_turns`: indices (among assistant turns) whose generation stopped at max_new_tokens. The
    template still closes them with its end-of-turn token, but the target never emitted it there,
    so it is not trained on (else the draft learns to end turns mid-answer).
    """
    text, spans = char_spans(tokenizer, messages, sample_id)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    special = special_ids if special_ids is not None else _special_ids(tokenizer)
    mask = [False] * len(ids)
    turns = []
    t = 0
    for cs, ce, content in spans:
        while t < len(ids) and offsets[t][1] <= cs:
            t += 1
        first = t
        while t < len(ids) and offsets[t][0] < ce:
            t += 1
        last = t  # exclusive
        if last == first:
            raise _template_error(sample_id, f"no token covers the assistant text {content[:40]!r}")
        end_token = None
        if last < len(ids) and ids[last] in special:
            end_token = ids[last]
            last += 1
        for k in range(first, last - (end_token is not None and len(turns) in cut_turns)):
            mask[k] = True
        turns.append((first, last))
        # Self-check: what training will see as "assistant" must be exactly the assistant text.
        got = tokenizer.decode(ids[first : last - (end_token is not None)], skip_special_tokens=False)
        if got.strip() != content.strip():
            raise _template_error(sample_id, f"masked tokens decode to {got[:60]!r}, expected {content[:60]!r}")
        if any(i in special for i in ids[first : last - (end_token is not None)]):
            raise _template_error(sample_id, "a special token falls inside an assistant message")
    truncated = len(ids) > max_length
    return MaskedSample(ids[:max_length], mask[:max_length], truncated, len(ids), turns)


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
    s = mask_conversation(tokenizer, probe, max_length=1 << 30, sample_id="template-probe")
    if sum(s.loss_mask) == 0:
        raise _template_error("template-probe", "no assistant tokens were found")
