"""tau and alpha_k are defined once (`speculate/acceptance.py`): on one constructed case, eval's
measured rounds, vLLM's counters, the held-out walk of training and the TTT estimate all give the
same numbers, the bonus token included in every tau."""

from __future__ import annotations

import pytest
import torch

from eagle3cli.engines.engine_api import SpecCounters
from eagle3cli.eval.endpoint import acceptance_summary
from eagle3cli.speculate.acceptance import (
    acceptance_by_depth,
    chain_summary,
    conditional_acceptance,
    simulated_accept_length,
    simulated_tau,
    tau_of,
    walk_rounds,
)

DEPTH = 3
ACCEPT_LENS = [0, 1, 3, 3, 2]  # five chain rounds of depth 3: 9 draft tokens accepted
TAU = (9 + 5) / 5  # 2.8 tokens per target pass
P = [4 / 5, 3 / 5, 2 / 5]  # P(first k draft tokens accepted), k = 1..3
ALPHA = [4 / 5, 3 / 4, 2 / 3]


def test_every_route_gives_the_same_tau_and_alpha():
    # eval: the decoder's accept length per round
    measured = acceptance_by_depth(ACCEPT_LENS, DEPTH)
    assert measured["tau"] == pytest.approx(TAU) and tau_of(ACCEPT_LENS) == pytest.approx(TAU)
    assert [r["alpha"] for r in measured["per_depth"]] == pytest.approx(ALPHA)
    assert [r["unconditional"] for r in measured["per_depth"]] == pytest.approx(P)

    # an engine: vLLM's counters over the same rounds (drafts, draft tokens, accepted, per position)
    per_pos = tuple(float(sum(a > k for a in ACCEPT_LENS)) for k in range(DEPTH))
    counters = SpecCounters(5.0, 15.0, 9.0, per_pos)
    assert counters.tau == pytest.approx(TAU) and counters.per_position() == pytest.approx(P)
    engine = acceptance_summary([{"drafts": 5.0, "accepted": 9.0, "per_pos": list(per_pos)}])
    assert engine["tau"] == pytest.approx(TAU) and engine["per_position"] == pytest.approx(P)

    # training's held-out walk: one answer (tokens 1..15 after a 1-token prompt) whose rounds, anchored
    # where the last one stopped, accept exactly ACCEPT_LENS
    length = torch.zeros(1, 16, dtype=torch.long)
    for t, n in zip([0, 1, 3, 7, 11], ACCEPT_LENS, strict=True):
        length[0, t] = n
    mask = torch.ones(1, 16, dtype=torch.bool)
    mask[0, 0] = False
    accepted, rounds = walk_rounds(length, mask, DEPTH)
    assert rounds == 5 and accepted.tolist() == list(per_pos)
    walk = chain_summary(accepted, torch.full((DEPTH,), float(rounds)))
    assert walk["tau"] == pytest.approx(TAU, abs=1e-4) and walk["alpha_k"] == pytest.approx(ALPHA, abs=1e-4)

    # the TTT estimate from the chain counts the loss keeps (anchors correct at all steps 0..k)
    alpha = conditional_acceptance([4, 3, 2], [5, 5, 5])
    assert alpha == pytest.approx(ALPHA)
    assert simulated_tau(alpha) == pytest.approx(TAU)
    assert simulated_accept_length(alpha) == pytest.approx(TAU - 1)  # metrics.jsonl's sim_accept_len: no bonus


def test_tau_by_position_assigns_each_round_to_the_span_it_starts_in():
    from eagle3cli.speculate.acceptance import tau_by_position

    # prompt A: rounds start at 0, 3 (a=2), 4 (a=0), 8 (a=3); spans [0,4), [4,8), [8,...)
    # prompt B: one round of 4 accepted at 0, then 0 at 5
    rows = tau_by_position([[2, 0, 3, 1], [4, 0]], edges=(0, 4, 8))
    assert rows == [
        {"from": 0, "to": 4, "rounds": 3, "tau": (2 + 0 + 4 + 3) / 3},
        {"from": 4, "to": 8, "rounds": 2, "tau": (3 + 0 + 2) / 2},
        {"from": 8, "to": None, "rounds": 1, "tau": 2.0},
    ]
    # every round is counted once: the spans' rounds and emitted tokens add up to the whole run's
    lens = [[1, 0, 2, 2, 0, 1], [0, 0, 5]]
    rows = tau_by_position(lens, edges=(0, 3, 6, 12))
    assert sum(r["rounds"] for r in rows) == 9
    assert sum(r["tau"] * r["rounds"] for r in rows) == sum(a + 1 for x in lens for a in x)
    assert tau_by_position([]) == []
