"""`eval --sweep`: measured tau per depth from real runs, the truncated-chain estimate labelled as
one with its error beside it; multi-turn eval; the sampled-mode distribution check in the report."""

from __future__ import annotations

import json

import pytest
from draft_stubs import OracleDraft

from eagle3cli.cli import main
from eagle3cli.eval.sweep import run_sweep
from eagle3cli.model.target import load_target
from eagle3cli.speculate.acceptance import acceptance_by_depth, tau_of
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.decoder import SpeculativeDecoder, plain_decode


@pytest.mark.slow
def test_sweep_measures_each_depth_and_labels_the_estimate(tiny_target_dir):
    model, tok, _ = load_target(tiny_target_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Count to ten."}], add_generation_prompt=True, tokenize=True
    )
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else ids
    n_new = 40
    seq = ids + plain_decode(model, ids, n_new, set()).tokens
    # agrees with the target except at every 4th position: rounds then restart at different places
    # for different depths, which is exactly what truncating one depth-5 run cannot see
    oracle = OracleDraft(seq, model.config.vocab_size, rank=lambda t: None if t % 4 == 3 else 0)
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    sw = run_sweep(
        model, oracle, aux, [("p0", ids)], set(),
        depth=5, tree_points=((3, 2, 5),), max_new_tokens=n_new, repeats=2,
        temperature=0.0, top_p=1.0, seed=0, tolerance=0.03,
    )  # fmt: skip
    rows = {r["name"]: r for r in sw["configurations"]}
    assert list(rows) == [f"chain d={d}" for d in range(1, 6)] + ["tree (3,2,5)"]
    deep = SpeculativeDecoder(model, oracle, aux, mode="chain", depth=5, eos=set()).generate(ids, n_new)
    estimate = acceptance_by_depth(deep.accept_lens, 5)["tau_by_depth_estimate"]
    for d in range(1, 6):
        real = SpeculativeDecoder(model, oracle, aux, mode="chain", depth=d, eos=set()).generate(ids, n_new)
        row = rows[f"chain d={d}"]
        assert row["tau"] == pytest.approx(tau_of(real.accept_lens))  # measured: a real depth-d run
        assert row["tau_estimate_from_depth_D"] == pytest.approx(estimate[d])  # labelled estimate
        assert row["tau_error"] == pytest.approx(estimate[d] - row["tau"])
        assert row["greedy_mismatches"] == 0 and len(row["speedup_per_repeat"]) == 2
    assert rows["chain d=5"]["tau_error"] == pytest.approx(0.0)  # the run's own depth is measured
    assert any(abs(rows[f"chain d={d}"]["tau_error"]) > 0.05 for d in range(1, 5))  # and the rest is not exact
    assert "tau_error" not in rows["tree (3,2,5)"] and rows["tree (3,2,5)"]["tau"] > 1
    assert "ESTIMATE" in sw["estimate_note"]
    rec = sw["recommended"]
    assert rec["name"] in rec["tied"] and rec["best_measured"] in rows


@pytest.fixture(scope="module")
def head(tiny_target_dir, tmp_path_factory):
    from head_fixtures import make_head

    return make_head(tiny_target_dir, tmp_path_factory.mktemp("sweep-head") / "head")


@pytest.mark.slow
def test_eval_sweep_report_and_recommendation(tiny_target_dir, head, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--target", str(tiny_target_dir), "--head", str(head), "--bench", "gsm8k", "--num-prompts", "2"]
    args += ["--max-new-tokens", "8", "--depth", "3", "--sweep", "--sweep-prompts", "2", "--sweep-max-new-tokens", "6"]
    args += ["--sweep-repeats", "2", "--sweep-tree", "2,2,4", "--out", str(out), "--no-generate-baseline"]
    assert main(args) == 0
    rep = json.loads((out / "report.json").read_text())
    names = [r["name"] for r in rep["sweep"]["configurations"]]
    assert names == ["chain d=1", "chain d=2", "chain d=3", "tree (2,2,4)"]
    rec = rep["recommended"]
    assert rec["from"].startswith("sweep") and rec["name"] in names
    # a random head: the note says so exactly when no configuration's interval reaches plain speed
    # (whether one does is timing, which a test must not assume)
    best = next(r for r in rep["sweep"]["configurations"] if r["name"] == rec["best_measured"])
    slower = best["speedup_interval"][1] < 1.0
    assert slower == any("no configuration beats plain decoding" in n for n in rec["notes"])


def test_turns_all_feeds_each_answer_back(tiny_target_dir, head, tmp_path):
    convs = tmp_path / "mt.jsonl"
    rows = [{"id": "q1", "turns": ["Name a colour.", "And another one?"]}, {"id": "q2", "turns": ["Hi."]}]
    convs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    args = ["eval", "--target", str(tiny_target_dir), "--head", str(head), "--bench", str(convs), "--turns", "all"]
    args += ["--max-new-tokens", "6", "--depth", "3", "--out", str(out)]
    assert main(args) == 0
    rep = json.loads((out / "report.json").read_text())
    chain = next(iter(rep["heads"].values()))["chain"]
    assert rep["units"] == 3 and [p["prompt"] for p in chain["per_prompt"]] == ["mt:q1#turn1", "mt:q1#turn2", "mt:q2"]
    assert {k: chain["lossless"][k] for k in ("compared", "mismatches", "examples", "near_ties")} == {
        "compared": 3,
        "mismatches": 0,
        "examples": [],
        "near_ties": 0,
    }
    assert rep["baselines"]["generate"]["tokens"] == rep["baselines"]["plain"]["tokens"]


@pytest.mark.slow
def test_sampled_eval_reports_the_rule_and_the_distribution_check(tiny_target_dir, head, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--target", str(tiny_target_dir), "--head", str(head), "--bench", "gsm8k", "--num-prompts", "1"]
    args += ["--max-new-tokens", "6", "--depth", "2", "--temperature", "1.0", "--sampling-check", "40"]
    args += ["--out", str(out), "--no-generate-baseline"]
    assert main(args) == 0
    rep = json.loads((out / "report.json").read_text())
    sc = rep["sampling_check"]
    assert "min(1, p(x)/q(x))" in sc["rule"] and sc["draws"] == 40 and sc["passed"]
    assert [t["position"] for t in sc["positions"]] == [1, 2, 3]
    chain = next(iter(rep["heads"].values()))["chain"]
    assert chain["lossless"]["compared"] == 0 and "rejection rule" in chain["lossless"]["note"]
