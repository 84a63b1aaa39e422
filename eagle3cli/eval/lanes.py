"""Decoding the bench in lanes: the target alone (our loop; transformers' generate) and every
(head, mode) decoder, each over the same prompts and turns.

With `--turns all` every lane keeps its own conversation: each user turn is appended to the
lane's history and the lane's own answer is fed back, so a speculative lane is compared with
plain decoding on exactly what it would serve. Greedy outputs are compared token for token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..console import progress, warn
from ..prompts import Prompt, render
from ..speculate.decoder import DecodeResult, hf_generate, plain_decode
from .config import EvalConfig
from .losslessness import first_diff, greedy_reference, near_tie


@dataclass
class Lane:
    """One decoder over the whole benchmark: its results per unit (prompt or conversation turn)
    and, for multi-turn runs, its own conversation history (its own answers fed back)."""

    results: list[DecodeResult] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)  # the token ids each unit was decoded from


@dataclass
class Decoded:
    lanes: dict  # "plain", "generate" (optional), (head label, mode) -> Lane
    units: list[str]  # prompt ids, or "ID#turnN" per turn of multi-turn conversations
    mismatches: dict  # (head label, mode) -> greedy outputs that part from plain decoding
    near_ties: dict = field(default_factory=dict)  # (head label, mode) -> those parting at a near tie
    reference: dict = field(default_factory=dict)  # what greedy outputs are compared with (greedy_reference)


def split_turns(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """(system messages before the first user turn, the user turns in order)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[:first], [m for m in messages[first:] if m["role"] == "user"]


def decode_lanes(
    cfg: EvalConfig,
    target,
    tok,
    eos: set[int],
    decoders: dict,
    convs: list[Prompt],
    fits: Callable[[str, list[int]], list[int]],
) -> Decoded:
    """Every lane over every prompt (and turn), lanes interleaved per unit so that load on the
    machine affects them alike; `fits` refuses a prompt that leaves no room to generate."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos), 0)
    lanes: dict = {"plain": Lane(), **({"generate": Lane()} if cfg.generate_baseline else {})}
    lanes.update({k: Lane() for k in decoders})
    run = Decoded(lanes, [], {k: [] for k in decoders}, {k: [] for k in decoders}, greedy_reference(target))
    greedy = cfg.temperature <= 0

    def decode(key, ids: list[int], seed: int) -> DecodeResult:
        if key == "plain":
            return plain_decode(target, ids, cfg.max_new_tokens, eos, cfg.temperature, cfg.top_p, seed=seed)
        if key == "generate":
            return hf_generate(target, ids, cfg.max_new_tokens, eos, pad)
        return decoders[key].generate(ids, cfg.max_new_tokens, seed=seed)

    with progress("eval", total=len(convs), unit="conv" if cfg.turns == "all" else "prompt") as bar:
        for i, (cid, msgs) in enumerate(convs):
            system, users = split_turns(msgs)
            turns = users if cfg.turns == "all" else users[:1]
            for lane in lanes.values():
                lane.history = list(system)
            conv_tokens = 0
            for t, user in enumerate(turns):
                uid = cid if len(turns) == 1 else f"{cid}#turn{t + 1}"
                run.units.append(uid)
                for key, lane in lanes.items():
                    lane.history.append(user)
                    ids = fits(uid, render(tok, lane.history))
                    r = decode(key, ids, cfg.seed + 1000 * i + t)
                    lane.prompts.append(ids)
                    lane.results.append(r)
                    lane.outputs.append(r.tokens)
                    # each decoder's own answer is its history: greedy, that is the target's own answer
                    lane.history.append(
                        {"role": "assistant", "content": tok.decode(r.tokens, skip_special_tokens=True)}
                    )
                    conv_tokens += len(r.tokens)
                if greedy:
                    _compare_greedy(run, uid, tok, target)
            bar.advance(1, tokens=conv_tokens)
    return run


def _compare_greedy(run: Decoded, uid: str, tok, target) -> None:
    """Greedy outputs of this unit against plain decoding's: a speculative lane that parts from it
    is recorded (a losslessness failure, or a near tie where the reference's precision is not exact:
    `greedy_reference`); transformers' generate parting is only warned about."""
    plain_out = run.lanes["plain"].outputs[-1]
    plain_prompt = run.lanes["plain"].prompts[-1]
    if "generate" in run.lanes and run.lanes["generate"].outputs[-1] != plain_out:
        warn(f"{uid}: our plain loop and transformers generate differ (numerics of the two paths)")
    for key, found in run.mismatches.items():
        spec_out = run.lanes[key].outputs[-1]
        if spec_out != plain_out:
            at = first_diff(spec_out, plain_out)
            row = {
                "prompt": uid,
                "first_diff_at": at,
                "speculative": tok.decode(spec_out[at : at + 12]),
                "plain": tok.decode(plain_out[at : at + 12]),
            }
            same_prompt = run.lanes[key].prompts[-1] == plain_prompt  # else an earlier turn parted already
            both = at < len(spec_out) and at < len(plain_out)
            tie = (
                near_tie(target, plain_prompt + plain_out[:at], plain_out[at], spec_out[at], run.reference)
                if same_prompt and both
                else None
            )
            if tie is not None:
                run.near_ties[key].append(row | tie)
            else:
                found.append(row)
