"""Benchmark prompts as chat messages, read by the same resolver and reader as gen-data
(eval and serve-bench both read them here).

`--bench` is a named source (gsm8k, mt_bench, humaneval, sharegpt, ultrachat, ... see
eagle3cli/readers/sources.py; eval takes the test split) or any file gen-data reads (ShareGPT,
`{messages}`, `{prompt}`, MT-bench `{turns}`...). Assistant turns a file carries are dropped:
eval always decodes the answers itself.
"""

from __future__ import annotations

from .console import warn
from .data.formats import parse_input_spec, read_input
from .errors import UsageError

Prompt = tuple[str, list[dict]]  # (id, messages)


def _records(bench: str, num_prompts: int | None, flag: str = "--bench") -> list[dict]:
    """The bench's records; messages name `flag` (serve-bench reads its --prompts through here)."""
    try:
        spec = parse_input_spec(bench, default_split="test")
    except UsageError as e:
        raise UsageError(f"{flag}: {e.what.removeprefix('--input ')}", e.expected, e.next_step) from e
    try:
        result = read_input(spec)
    except UsageError as e:  # the reader speaks of gen-data's --input
        raise UsageError(f"{flag} {e.what.removeprefix('--input ')}", e.expected, e.next_step) from e
    if result.rejects:
        counts = ", ".join(f"{k} {v}" for k, v in result.reject_counts.most_common())
        warn(f"{flag} {bench}: {len(result.rejects)} unusable rows skipped ({counts})")
    if not result.records:
        raise UsageError(f"{flag} {bench} has no usable prompts", "rows with at least one user turn")
    return result.records[:num_prompts]


def _without_answers(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] != "assistant"]


def load_prompts(bench: str, num_prompts: int, flag: str = "--bench") -> list[Prompt]:
    """[(id, messages)] for the first `num_prompts` prompts: system turn (if any) + first user turn."""
    out = []
    for r in _records(bench, num_prompts, flag):
        msgs = _without_answers(r["messages"])
        first_user = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        out.append((r["id"], msgs[: first_user + 1]))
    return out


def load_conversations(bench: str, num_prompts: int | None) -> list[Prompt]:
    """[(id, messages)] with every user turn (MT-bench's two): the caller answers each in turn."""
    return [(r["id"], _without_answers(r["messages"])) for r in _records(bench, num_prompts)]


def render(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)
