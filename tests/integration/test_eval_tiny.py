"""`eagle3 eval` on the committed trained target with real GSM8K / MT-bench prompts: greedy
speculative output equals plain decoding and `generate` (natural EOS stops included), for chain
and tree, and the report is complete. The head is started from the target (its lm_head rows and
final norm, `init_draft_from_target`) so it agrees often enough to exercise long accepts."""

from __future__ import annotations

import json

import pytest
import torch
from head_fixtures import init_draft_from_target

from eagle3cli.cli import main
from eagle3cli.head.write import save_head
from eagle3cli.model.target import load_target, target_identity
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def head(trained_target_dir, tmp_path_factory):
    model, tok, path = load_target(trained_target_dir)
    v = model.config.vocab_size
    cfg = draft_config_from_target(model.config, v, default_aux_layer_ids(model.config.num_hidden_layers))
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    init_draft_from_target(draft, model, torch.zeros(v, dtype=torch.long))
    with torch.no_grad():  # fc passes the top aux feature (input of layer L-3) straight through
        h = model.config.hidden_size
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * h :].copy_(torch.eye(h))
        draft.midlayer.self_attn.o_proj.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
    return save_head(
        draft, tmp_path_factory.mktemp("eval-int") / "head", target_identity(path, tok, model.config).as_dict()
    )


# MT-bench's prompts run with `make test-all` only: with GSM8K's, these were the fast tier's two costliest tests
@pytest.mark.parametrize("bench", ["gsm8k", pytest.param("mt_bench", marks=pytest.mark.slow)])
def test_eval_on_trained_target_is_lossless(trained_target_dir, head, bench, tmp_path):
    out = tmp_path / "eval"
    rc = main(
        [
            "eval",
            "--target",
            str(trained_target_dir),
            "--head",
            str(head),
            "--bench",
            bench,
            "--num-prompts",
            "3",
            "--max-new-tokens",
            "48",
            "--depth",
            "6",
            "--mode",
            "both",
            "--topk",
            "3",
            "--num-draft-tokens",
            "10",
            "--out",
            str(out),
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    st = next(iter(rep["heads"].values()))
    for mode in ("chain", "tree"):
        lossless = st[mode]["lossless"]
        assert {k: lossless[k] for k in ("compared", "mismatches", "examples", "near_ties")} == {
            "compared": 3, "mismatches": 0, "examples": [], "near_ties": 0,
        }  # fmt: skip
        assert lossless["reference"]["reference"].startswith("plain decoding") and lossless["reference"]["exact"]
    assert rep["baselines"]["generate"]["tokens"] == rep["baselines"]["plain"]["tokens"]
    assert st["chain"]["acceptance"]["rounds"] > 0
