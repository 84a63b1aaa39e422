"""Acceptance statistics and the cost model behind `recommended`."""

from __future__ import annotations

import pytest

from eagle3cli.eval.metrics import acceptance_by_depth, interpolate, recommend


def test_acceptance_by_depth_counts_and_tau():
    acc = acceptance_by_depth([0, 1, 3, 3, 2], depth=3)
    rows = acc["per_depth"]
    assert [(r["accepted"], r["attempts"]) for r in rows] == [(4, 5), (3, 4), (2, 3)]
    assert rows[1]["alpha"] == pytest.approx(3 / 4)
    assert [r["unconditional"] for r in rows] == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    assert acc["tau"] == pytest.approx((0 + 1 + 3 + 3 + 2 + 5) / 5)
    assert acc["tau_by_depth"] == pytest.approx([1, 1.8, 2.4, 2.8])
    assert acc["tau_by_depth"][-1] == pytest.approx(acc["tau"])  # the identity at the run's own depth
    assert acc["accept_len_histogram"] == [1, 1, 1, 2]


def test_always_and_never():
    assert acceptance_by_depth([4] * 7, 4)["tau"] == 5
    never = acceptance_by_depth([0] * 7, 4)
    assert never["tau"] == 1 and never["per_depth"][1]["alpha"] is None


def test_recommend_uses_measured_costs():
    cost = {"target": {1: 4.0, 2: 4.5, 4: 5.0, 8: 5.5, 16: 6.5}, "draft_step": 0.3}
    assert interpolate(cost["target"], 6) == pytest.approx(5.25)
    taus = [1.0, 1.9, 2.6, 3.1, 3.3, 3.35]  # saturating: deeper stops paying off
    rec = recommend(taus, cost)
    assert (rec["steps"], rec["topk"], rec["num_draft_tokens"]) == (3, 1, 4)
    rec = recommend(taus, cost, {"tau": 4.5, "steps": 5, "topk": 4, "num_draft_tokens": 16})
    assert (rec["steps"], rec["topk"], rec["num_draft_tokens"]) == (5, 4, 16)
    bad = recommend([1.0, 1.01], cost)
    assert bad["steps"] == 1 and "no configuration" in bad["note"]
