"""benchmarks/stages/data_scaling.py: the log2 fit, its test on the largest size, tokens for a tau."""

from __future__ import annotations

import math

import pytest

from benchmarks.stages.data_scaling import analyse, fit_log2, tokens_for


def test_the_fit_recovers_a_log_law_and_predicts_the_largest_size():
    rows = [{"tokens": 2**k, "heldout_tau": 1.0 + 0.25 * k} for k in (16, 17, 18, 19, 20)]
    a, b = fit_log2([(r["tokens"], r["heldout_tau"]) for r in rows])
    assert a == pytest.approx(1.0) and b == pytest.approx(0.25)
    f = analyse(rows, "heldout_tau")
    assert f["predicted_full"] == pytest.approx(6.0) and f["measured_full"] == pytest.approx(6.0)
    assert f["tokens_for_tau"]["3.0"] == pytest.approx(2**8)
    # a measured largest size below the trend shows as predicted > measured
    rows[-1]["heldout_tau"] = 5.5
    f = analyse(rows, "heldout_tau")
    assert f["predicted_full"] == pytest.approx(6.0) and f["measured_full"] == 5.5
    assert "predicted_corpus" not in f  # the largest size was the whole corpus


def test_a_curve_short_of_the_corpus_predicts_the_corpus_from_every_size():
    rows = [{"tokens": 2**k, "mt_bench_tau": 1.0 + 0.25 * k} for k in (16, 17, 18, 19)]
    f = analyse(rows, "mt_bench_tau", corpus_tokens=2**23)
    assert f["largest_tokens"] == 2**19 and f["corpus_tokens"] == 2**23
    assert f["predicted_corpus"] == pytest.approx(1.0 + 0.25 * 23)
    assert "predicted_corpus" not in analyse(rows, "mt_bench_tau", corpus_tokens=2**19)


def test_no_fit_from_too_few_sizes_and_no_tokens_when_tau_does_not_grow():
    assert analyse([{"tokens": 1, "x": 1.0}, {"tokens": 2, "x": 1.1}], "x") is None
    assert tokens_for(3.0, 2.0, -0.1) is None
    assert tokens_for(3.0, 2.0, 0.5) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        fit_log2([(8, 1.0), (8, 1.2)])
    assert math.isclose(fit_log2([(2, 1.0), (8, 2.0)])[1], 0.5)
