"""--help groups a stage's flags in panels that its config declares (`PANELS`): train's and
gen-data's every flag sits in exactly one, gen-data's data levers in one of their own."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

import eagle3cli.cli  # noqa: F401  (registers every command)
from eagle3cli.config import panel_of
from eagle3cli.data.config import LEVER_FIELDS, PLAN_FIELDS, GenDataConfig
from eagle3cli.eval.config import EvalConfig
from eagle3cli.options import STAGE_COMMANDS
from eagle3cli.train.config import TrainConfig


def help_panels(*args: str) -> dict[str, str]:
    """{panel title: its text} of `eagle3 ARGS --help`, as a wide terminal shows it."""
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    out = subprocess.run(
        [sys.executable, "-m", "eagle3cli", *args, "--help"], capture_output=True, text=True, env=env, check=True
    ).stdout
    parts = re.split(r"^[╭+]─ (.+?) ─+[╮+]$", out, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("name", sorted(STAGE_COMMANDS))
def test_a_panel_names_real_fields_each_once(name):
    cls = STAGE_COMMANDS[name][0]
    fields = [f.name for f in dataclasses.fields(cls)]
    listed = [n for names in getattr(cls, "PANELS", {}).values() for n in names]
    assert set(listed) <= set(fields), set(listed) - set(fields)
    assert len(listed) == len(set(listed)), [n for n in listed if listed.count(n) > 1]


@pytest.mark.parametrize("cls", [TrainConfig, GenDataConfig, EvalConfig])
def test_every_flag_of_train_gen_data_and_eval_is_in_a_panel(cls):
    assert [f.name for f in dataclasses.fields(cls) if panel_of(cls, f.name) is None] == []
    assert 5 <= len(cls.PANELS) <= 8


def test_gen_datas_data_levers_are_one_panel_and_still_plan_fields():
    assert GenDataConfig.PANELS["Data levers"] == LEVER_FIELDS and set(LEVER_FIELDS) <= set(PLAN_FIELDS)
    panels = help_panels("gen-data")
    levers = panels["Data levers"]
    for f in LEVER_FIELDS:
        assert f"--{f.replace('_', '-')} " in levers, f
    assert "--temperature " not in levers and "--temperature " in panels["Generation"]


def test_train_help_shows_its_panels_in_order_with_their_flags():
    panels = help_panels("train")
    assert list(panels) == ["Options", *TrainConfig.PANELS]
    assert "--recipe" in panels["Options"]
    for title, names in TrainConfig.PANELS.items():
        text = panels[title]
        for n in names:
            dashed = n.replace("_", "-")
            assert f"--{dashed}" in text or (n == "ttt_steps" and "--depth" in text), (title, n)
