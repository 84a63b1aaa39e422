"""`eagle3 eval --sweep`: measure real runs of every candidate serving configuration.

Candidates: chains of depth 1..D and a few EAGLE-2 trees (SGLang's (steps, topk, draft tokens)).
Each repeat decodes every prompt with plain decoding and every candidate, in an order rotated
per prompt and repeat, so machine load drifts over all of them alike. A prompt's time per
configuration is the median over repeats (one load spike does not move it). Measured tau for
depth d comes from a real depth-d run; the truncated depth-D estimate is put beside it with
its error, so the report shows how far the estimate is off on this head and bench.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..console import log, progress
from ..speculate.acceptance import ESTIMATE_NOTE, acceptance_by_depth, tau_of
from ..speculate.decoder import SpeculativeDecoder, plain_decode
from .losslessness import first_diff, greedy_reference, near_tie
from .metrics import bootstrap_ratio, choose_config


@dataclass(frozen=True)
class Candidate:
    steps: int
    topk: int
    num_draft_tokens: int

    @property
    def mode(self) -> str:
        return "chain" if self.topk == 1 else "tree"

    @property
    def name(self) -> str:
        if self.mode == "chain":
            return f"chain d={self.steps}"
        return f"tree ({self.steps},{self.topk},{self.num_draft_tokens})"

    def as_dict(self) -> dict:
        return {"steps": self.steps, "topk": self.topk, "num_draft_tokens": self.num_draft_tokens}


def candidates(depth: int, tree_points: tuple[tuple[int, int, int], ...]) -> list[Candidate]:
    """Chains 1..depth, then the tree points (duplicates and chains among them dropped)."""
    out = [Candidate(d, 1, d + 1) for d in range(1, depth + 1)]
    for steps, topk, ndt in tree_points:
        c = Candidate(steps, topk, ndt)
        if c not in out:
            out.append(c)
    return out


def parse_tree_points(specs: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    """ "5,4,8" -> (5, 4, 8): SGLang's --speculative-num-steps, -eagle-topk, -num-draft-tokens."""
    out = []
    for s in specs:
        parts = str(s).replace(" ", "").split(",")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"--sweep-tree {s!r}: expected STEPS,TOPK,DRAFT_TOKENS, e.g. 5,4,8")
        steps, topk, ndt = (int(p) for p in parts)
        if steps < 1 or topk < 1 or not 2 <= ndt <= steps * topk + 1:
            raise ValueError(
                f"--sweep-tree {s!r}: needs steps, topk >= 1 and 2 <= draft tokens <= steps*topk+1 = {steps * topk + 1}"
            )
        out.append((steps, topk, ndt))
    return tuple(out)


def run_sweep(
    target,
    draft,
    aux: tuple[int, ...],
    prompts: list[tuple[str, list[int]]],
    eos: set[int],
    *,
    depth: int,
    tree_points: tuple[tuple[int, int, int], ...],
    max_new_tokens: int,
    repeats: int,
    temperature: float,
    top_p: float,
    seed: int,
    tolerance: float,
) -> dict:
    cands = candidates(depth, tree_points)
    decoders = {
        c.name: SpeculativeDecoder(
            target,
            draft,
            aux,
            mode=c.mode,
            depth=c.steps,
            topk=c.topk,
            num_draft_tokens=c.num_draft_tokens,
            temperature=temperature,
            top_p=top_p,
            eos=eos,
        )
        for c in cands
    }
    m = _measure(target, decoders, prompts, eos, max_new_tokens, repeats, temperature, top_p, seed)
    tokens, seconds, accepts, outputs = m.tokens, m.seconds, m.accepts, m.outputs
    names, n = ["plain", *decoders], len(prompts)
    ref = greedy_reference(target)
    mismatches = {
        k: sum(_parts(target, prompts[p][1], outputs[k][p], outputs["plain"][p], ref) for p in range(n))
        for k in decoders
    }
    median = {k: [statistics.median(seconds[k][p]) for p in range(n)] for k in names}
    plain = (tokens["plain"], median["plain"])
    choice = choose_config(
        [{"name": c.name, **c.as_dict(), "tokens": tokens[c.name], "seconds": median[c.name]} for c in cands],
        plain,
        tolerance,
    )
    by_name = {row["name"]: row for row in choice["candidates"]}
    chain_d = f"chain d={depth}"
    estimate = acceptance_by_depth([a for p in accepts[chain_d] for a in p], depth)["tau_by_depth_estimate"]
    rows = [_row(c, m, by_name[c.name], estimate, temperature, mismatches[c.name]) for c in cands]
    return {
        "prompts": [pid for pid, _ in prompts],
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "timing": "per prompt: median seconds over repeats; order of configurations rotated per prompt and repeat",
        "speedup_definition": "tokens/s of the configuration / tokens/s of plain decoding, same prompts, same process",
        "interval": "90% paired bootstrap over prompts",
        "estimate_note": ESTIMATE_NOTE,
        "plain_tokens_per_s": sum(tokens["plain"]) / sum(median["plain"]),
        "configurations": rows,
        "recommended": choice["recommended"],
        "greedy_reference": ref,
    }


def _parts(target, prompt: list[int], spec: list[int], plain: list[int], ref: dict) -> bool:
    """A greedy output that parts from plain decoding's other than at a near tie (`greedy_reference`)."""
    if spec == plain:
        return False
    at = first_diff(spec, plain)
    both = at < len(spec) and at < len(plain)
    return not (both and near_tie(target, prompt + plain[:at], plain[at], spec[at], ref))


@dataclass
class Measured:
    """Per decoder name ("plain" or a configuration) and prompt: tokens and outputs of the first
    repeat, seconds of every repeat, accept lengths per verification round."""

    tokens: dict[str, list[int]]
    seconds: dict[str, list[list[float]]]
    accepts: dict[str, list[list[int]]]
    outputs: dict[str, list[list[int]]]


def _measure(
    target, decoders: dict, prompts, eos: set[int], max_new_tokens: int, repeats: int, temperature, top_p, seed
) -> Measured:
    """Every configuration and plain decoding on every prompt, `repeats` times, the order of
    configurations rotated per prompt and repeat so that a slow moment of the machine is shared."""
    names = ["plain", *decoders]
    n = len(prompts)
    seconds = {k: [[0.0] * repeats for _ in range(n)] for k in names}
    tokens = {k: [0] * n for k in names}
    accepts: dict[str, list[list[int]]] = {k: [[] for _ in range(n)] for k in decoders}
    outputs: dict[str, list[list[int]]] = {k: [[] for _ in range(n)] for k in names}

    def run(name: str, p: int, ids: list[int]):
        if name == "plain":
            return plain_decode(target, ids, max_new_tokens, eos, temperature, top_p, seed=seed + p)
        return decoders[name].generate(ids, max_new_tokens, seed=seed + p)

    warm = prompts[0][1]
    for name in names:  # first calls allocate and pick kernels: keep them out of the timings
        run(name, 0, warm)
    log(
        f"sweep: {len(decoders)} configurations + plain, {n} prompts x {repeats} repeats, "
        f"{max_new_tokens} new tokens, interleaved"
    )
    with progress("sweep", total=repeats * n, unit="prompt") as bar:
        for r in range(repeats):
            for p, (_, ids) in enumerate(prompts):
                shift = (r * n + p) % len(names)
                for name in names[shift:] + names[:shift]:
                    res = run(name, p, ids)
                    seconds[name][p][r] = res.seconds
                    if r == 0:
                        tokens[name][p] = len(res.tokens)
                        outputs[name][p] = res.tokens
                        if name != "plain":
                            accepts[name][p] = list(res.accept_lens)
                bar.advance(1)
    return Measured(tokens, seconds, accepts, outputs)


def _row(c, m: Measured, choice_row: dict, estimate: list[float], temperature: float, mismatches: int) -> dict:
    """One configuration's line of the sweep report."""
    n, repeats = len(m.tokens["plain"]), len(m.seconds["plain"][0])
    flat = [a for p in m.accepts[c.name] for a in p]
    per_repeat = []
    for r in range(repeats):
        spec_rate = sum(m.tokens[c.name]) / sum(m.seconds[c.name][p][r] for p in range(n))
        plain_rate = sum(m.tokens["plain"]) / sum(m.seconds["plain"][p][r] for p in range(n))
        per_repeat.append(round(spec_rate / plain_rate, 4))
    sp = choice_row["speedup"]
    row = {
        "name": c.name,
        "mode": c.mode,
        **c.as_dict(),
        "tau": tau_of(flat),
        "tau_interval": _tau_interval(m.accepts[c.name]),
        "rounds": len(flat),
        "speedup": round(sp["value"], 4),
        "speedup_interval": [round(sp["low"], 4), round(sp["high"], 4)],
        "speedup_per_repeat": per_repeat,
        "vs_best": round(choice_row["vs_best"]["value"], 4),
        "tied_with_best": choice_row["tied_with_best"],
        "greedy_mismatches": mismatches if temperature <= 0 else None,
    }
    if c.mode == "chain":
        row["tau_estimate_from_depth_D"] = estimate[c.steps]
        row["tau_error"] = estimate[c.steps] - row["tau"]  # estimate minus measured
    return row


def _tau_interval(per_prompt: list[list[int]]) -> list[float]:
    emitted = [sum(a) + len(a) for a in per_prompt]
    rounds = [len(a) for a in per_prompt]
    if not any(rounds):
        return [1.0, 1.0]
    ci = bootstrap_ratio((emitted, rounds))
    return [round(ci["low"], 4), round(ci["high"], 4)]
