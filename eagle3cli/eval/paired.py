"""A speculative server against a plain one on the same prompts (`eval --endpoint --base-endpoint`),
for every engine: the order the two are measured in, and the speed-up with its interval.

On a shared machine the load moves from minute to minute. Measuring every prompt on the speculative
server and then every prompt on the plain one puts the two halves in different minutes: two runs
of one configuration read 1.55x and 1.25x on this 2-core box (vLLM's CPU build, 16 prompts). Each
prompt goes to both servers back to back instead, the first server alternating from prompt to
prompt (spec-plain, plain-spec, ...), so drift and any warm-cache advantage of going second fall
on both sides alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from .metrics import bootstrap_ratio

ORDER = "interleaved: each prompt on both servers back to back, the first of the two alternating by prompt"
# the order of reports written before this module (they carry no `order`; vLLM's path measured so)
BLOCKS_ORDER = "blocks: every prompt on the speculative server, then every prompt on the plain one"

One = Callable[[str, int, object, list[int]], Awaitable[dict]]


async def run_interleaved(
    urls: Sequence[str], prompts: Sequence[tuple[object, list[int]]], one: One
) -> list[list[dict]]:
    """rows[i][k] = one(urls[i], k, prompt id, token ids) for every prompt k, servers interleaved per
    prompt and their order reversed on every other prompt."""
    rows: list[list[dict]] = [[] for _ in urls]
    for k, (pid, ids) in enumerate(prompts):
        order = list(range(len(urls)))
        if k % 2:
            order.reverse()
        got = {i: await one(urls[i], k, pid, ids) for i in order}
        for i in range(len(urls)):
            rows[i].append(got[i])
    return rows


def paired_speedup(spec: Sequence[dict], plain: Sequence[dict], level: float = 0.9) -> dict:
    """Sequential tokens/s of `spec` over `plain` (rows with completion_tokens and seconds, one per
    prompt, the same prompts in the same order) with a paired bootstrap interval over prompts."""
    if len(spec) != len(plain):
        raise ValueError(f"paired_speedup: {len(spec)} speculative rows against {len(plain)} plain ones")
    b = bootstrap_ratio(
        ([float(r["completion_tokens"]) for r in spec], [float(r["seconds"]) for r in spec]),
        ([float(r["completion_tokens"]) for r in plain], [float(r["seconds"]) for r in plain]),
        level=level,
    )
    return {"value": b["value"], "interval": [b["low"], b["high"]], "level": level, "prompts": b["prompts"]}


def speedup_cell(baseline: dict) -> str:
    """The table's speed-up: the value and its 90% interval over prompts."""
    v, iv = baseline.get("speedup"), baseline.get("speedup_interval")
    if v is None:
        return "-"
    return f"{v:.3f} [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else f"{v:.3f}"
