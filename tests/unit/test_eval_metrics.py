"""Acceptance statistics, paired bootstrap intervals, and the measured choice of a serving config."""

from __future__ import annotations

import pytest

from eagle3cli.eval.losslessness import two_sample_chi_square
from eagle3cli.eval.metrics import bootstrap_ratio, choose_config
from eagle3cli.eval.sweep import candidates, parse_tree_points
from eagle3cli.speculate.acceptance import acceptance_by_depth


def test_acceptance_by_depth_counts_and_tau():
    acc = acceptance_by_depth([0, 1, 3, 3, 2], depth=3)
    rows = acc["per_depth"]
    assert [(r["accepted"], r["attempts"]) for r in rows] == [(4, 5), (3, 4), (2, 3)]
    assert rows[1]["alpha"] == pytest.approx(3 / 4)
    assert [r["unconditional"] for r in rows] == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    assert acc["tau"] == pytest.approx((0 + 1 + 3 + 3 + 2 + 5) / 5)
    assert acc["tau_by_depth_estimate"] == pytest.approx([1, 1.8, 2.4, 2.8])
    assert acc["tau_by_depth_estimate"][-1] == pytest.approx(acc["tau"])  # only index D is the run's own
    assert "ESTIMATE" in acc["tau_by_depth_note"] and acc["alpha_definition"].startswith("chain:")
    assert acc["accept_len_histogram"] == [1, 1, 1, 2]


def test_tree_section_has_its_own_definition_and_no_depth_taus():
    acc = acceptance_by_depth([0, 2, 2], depth=3, mode="tree")
    assert acc["alpha_definition"].startswith("tree:") and "accepted path" in acc["alpha_definition"]
    assert "tau_by_depth_estimate" not in acc and acc["tau"] == pytest.approx(7 / 3)


def test_always_and_never():
    assert acceptance_by_depth([4] * 7, 4)["tau"] == 5
    never = acceptance_by_depth([0] * 7, 4)
    assert never["tau"] == 1 and never["per_depth"][1]["alpha"] is None


def test_bootstrap_ratio_is_paired_and_brackets_the_value():
    a_num, a_den = [10, 20, 30, 40], [1.0, 2.0, 3.0, 4.0]  # exactly 10 per unit on every prompt
    b = ([5, 10, 15, 20], [1.0, 2.0, 3.0, 4.0])
    r = bootstrap_ratio((a_num, a_den), b)
    assert r["value"] == r["low"] == r["high"] == pytest.approx(2.0)  # paired: no spread at all
    noisy = bootstrap_ratio(([10, 30, 12, 25], [1.0, 2.0, 1.5, 1.0]))
    assert noisy["low"] < noisy["value"] < noisy["high"]
    with pytest.raises(ValueError):
        bootstrap_ratio(([1], [1.0]), ([1, 2], [1.0, 1.0]))


def _cand(name, steps, topk, ndt, secs):
    return {
        "name": name,
        "steps": steps,
        "topk": topk,
        "num_draft_tokens": ndt,
        "tokens": [100] * len(secs),
        "seconds": secs,
    }


def test_choose_config_ties_go_to_the_cheapest_and_clear_winners_win():
    plain = ([100] * 4, [2.0, 2.1, 1.9, 2.0])
    # depth 4 and 6 within 1% of each other, depth 2 clearly slower
    cands = [
        _cand("chain d=2", 2, 1, 3, [1.6, 1.7, 1.5, 1.6]),
        _cand("chain d=4", 4, 1, 5, [1.00, 1.06, 0.95, 1.00]),
        _cand("chain d=6", 6, 1, 7, [0.99, 1.05, 0.94, 0.99]),
    ]
    out = choose_config(cands, plain, tolerance=0.03)
    rec = out["recommended"]
    assert rec["best_measured"] == "chain d=6" and rec["tied"] == ["chain d=4", "chain d=6"]
    assert (rec["steps"], rec["topk"], rec["num_draft_tokens"]) == (4, 1, 5)  # cheapest of the tie
    assert rec["speedup_interval"][0] <= rec["speedup"] <= rec["speedup_interval"][1]
    assert any("tied" in n for n in rec["notes"])
    # the same comparison with a clear gap: the best wins alone
    cands[2] = _cand("chain d=6", 6, 1, 7, [0.70, 0.74, 0.66, 0.70])
    rec = choose_config(cands, plain, tolerance=0.03)["recommended"]
    assert rec["tied"] == ["chain d=6"] and rec["steps"] == 6 and rec["notes"] == []


def test_choose_config_says_when_nothing_beats_plain():
    plain = ([100] * 3, [1.0, 1.0, 1.0])
    rec = choose_config([_cand("chain d=3", 3, 1, 4, [2.0, 2.1, 1.9])], plain, 0.03)["recommended"]
    assert rec["steps"] == 3 and any("no configuration beats plain decoding" in n for n in rec["notes"])


def test_sweep_candidates_and_tree_points():
    names = [c.name for c in candidates(3, parse_tree_points(("5,4,8", "2,1,3")))]
    assert names == ["chain d=1", "chain d=2", "chain d=3", "tree (5,4,8)"]  # (2,1,3) is chain d=2
    for bad in ("5,4", "5,4,30", "a,b,c"):
        with pytest.raises(ValueError, match="--sweep-tree"):
            parse_tree_points((bad,))


def test_two_sample_chi_square():
    same = two_sample_chi_square([1, 2, 3] * 100, [3, 2, 1] * 100)
    assert same["p_value"] > 0.99 and same["dof"] == 2
    shifted = two_sample_chi_square([1] * 200 + [2] * 100, [1] * 100 + [2] * 200)
    assert shifted["p_value"] < 1e-6


def test_acceptance_tables_have_no_blank_headed_column(monkeypatch):
    """A tree has no tau(k) by depth: its table leaves the column out instead of an unnamed one."""
    from eagle3cli.eval import report as report_module

    tables = []
    monkeypatch.setattr(report_module, "print_table", lambda title, headers, rows: tables.append((headers, rows)))
    per_depth = [{"depth": 1, "accepted": 3, "attempts": 4, "alpha": 0.75, "unconditional": 0.75}]
    acc = {"per_depth": per_depth, "alpha_definition": "conditional"}
    rep = {
        "bench": "b",
        "depth": 1,
        "heads": {
            "h": {"chain": {"acceptance": {**acc, "tau_by_depth_estimate": {1: 1.75}}}, "tree": {"acceptance": acc}}
        },
    }
    report_module._acceptance_tables(rep)
    (chain_h, chain_rows), (tree_h, tree_rows) = tables
    assert chain_h[-1] == "tau(k)" and len(chain_rows[0]) == len(chain_h) == 5
    assert all(tree_h) and "tau(k)" not in tree_h and len(tree_rows[0]) == len(tree_h) == 4
