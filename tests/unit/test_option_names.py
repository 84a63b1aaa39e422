"""One name per thing across the stages (issue 51, item 5): the draft depth is `--depth` wherever a
stage sets it, the old spellings still parse; `--aux-layers` has one parser; the held-out depth keeps
one key from the measurement to the curve; and two long signatures stay short."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from eagle3cli import options
from eagle3cli.cli import main
from eagle3cli.speculate.aux_layers import named_aux_layer_ids, parse_aux_layers

REPO = Path(__file__).resolve().parents[2]


# stage: (the flags every command line needs, the config field that holds the draft depth, its old flag)
DEPTH = {
    "train": (["--run", "r"], "ttt_steps", "--ttt-steps"),
    "eval": (["--head", "h"], "depth", None),
    "export": (["--head", "h", "--out", "o"], "num_speculative_tokens", "--num-speculative-tokens"),
    "serve": (["--target", "t", "--head", "h", "--topk", "1", "--draft-tokens", "4"], "steps", "--steps"),
}


@pytest.mark.parametrize("stage", sorted(DEPTH))
def test_the_draft_depth_is_depth_in_every_stage_and_the_old_name_still_works(stage, parse):
    required, field, old = DEPTH[stage]
    assert getattr(parse([stage, *required, "--depth", "3"]), field) == 3
    if old is not None:
        assert getattr(parse([stage, *required, old, "3"]), field) == 3
    # the recipe key is the field, as before: recipes written with it keep loading
    cls, _section = options.STAGE_COMMANDS[stage]
    names = {f.name: options.flag_names(f) for f in dataclasses.fields(cls)}
    assert names[field][0] == "--depth"


def test_the_held_out_depth_keeps_its_flag_beside_depth(parse):
    cfg = parse(["train", "--run", "r", "--depth", "2", "--heldout-depth", "5"])
    assert (cfg.ttt_steps, cfg.heldout_depth) == (2, 5)


def test_aux_layers_have_one_parser():
    assert parse_aux_layers("2,6,9") == parse_aux_layers("2 6 9") == parse_aux_layers([2, 6, 9]) == (2, 6, 9)
    assert [parse_aux_layers(n) for n in ("cache", "default", "top")] == ["cache", "default", "top"]
    for bad in ("", "2,x", "2.5", [2.5], [True], "cache,2"):
        with pytest.raises(ValueError):
            parse_aux_layers(bad)
    assert named_aux_layer_ids("default", 12) == (2, 6, 9) and named_aux_layer_ids("top", 12) == (11,)
    assert named_aux_layer_ids((1, 4), 12) == (1, 4) and named_aux_layer_ids("cache", 12) is None


def test_train_and_cache_refuse_the_same_aux_ids(parse, capsys):
    for ids in ("0,2", "6,2", "2,x"):
        assert main(["train", "--run", "r", "--aux-layers", ids]) == 2
        train_err = " ".join(capsys.readouterr().err.split())
        assert main(["cache", "--run", "r", "--aux-layers", ids]) == 2
        cache_err = " ".join(capsys.readouterr().err.split())
        assert "--aux-layers" in train_err and "--aux-layers" in cache_err, ids
    assert parse(["train", "--run", "r", "--aux-layers", "2,4"]).aux_layers == "2,4"
    assert parse(["cache", "--run", "r", "--aux-layers", "2,4"]).aux_layers == (2, 4)


def test_the_held_out_depth_has_one_key_from_measurement_to_curve():
    """measure_heldout's point is written to metrics.jsonl and read by the curve under the same keys
    (it was `depth` -> `heldout_depth` -> `depth`)."""
    src = (REPO / "eagle3cli" / "train" / "loop.py").read_text(encoding="utf-8")
    assert 'f"heldout_{k}"' not in src
    assert '"depth":' not in src and "get('depth'" not in (REPO / "eagle3cli" / "train" / "heldout.py").read_text()


def test_long_signatures_and_bodies_stay_short():
    from eagle3cli.data import run as data_run
    from eagle3cli.eval import run as eval_run

    assert len(inspect.signature(data_run.generate).parameters) <= 8
    assert len(inspect.getsource(inspect.unwrap(eval_run._run_eval)).splitlines()) <= 60
