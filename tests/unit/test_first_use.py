"""What a new user hit on a fresh clone (issue 21): hints that name the real folder, a recipe of
another stage refused, optional values cleared with `none`, progress without a terminal, rates of
this session only, and --help that shows what each option takes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from eagle3cli import console
from eagle3cli.cli import main
from eagle3cli.config import build_config
from eagle3cli.errors import UsageError
from eagle3cli.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "args, hint",
    [
        (["cache", "--run", "{run}"], "next: eagle3 gen-data --target TARGET --input FILE --run {run}"),
        (["train", "--run", "{run}"], "next: eagle3 cache --run {run}"),
        (["eval", "--run", "{run}", "--target", "models/tiny-target"], "next: eagle3 train --run {run}"),
        (
            ["serve", "--head", "{run}/head", "--target", "models/tiny-target", "--dry-run"],
            "next: eagle3 train --run {run}",
        ),
    ],
)
def test_a_missing_input_names_the_run_folder_and_the_stage_that_makes_it(tmp_path, capsys, args, hint):
    run = str(tmp_path / "nope")
    assert main([a.replace("{run}", run) for a in args]) == 2
    text = _err(capsys)
    assert hint.replace("{run}", run) in text and "runs/NAME" not in text


def test_a_recipe_without_this_stage_is_refused_naming_its_sections(tmp_path, capsys):
    assert main(["cache", "--recipe", str(ROOT / "recipes/tiny/train.yaml"), "--run", str(tmp_path / "r")]) == 2
    text = _err(capsys)
    assert "has no `cache:` section (it has train:)" in text and "recipes/tiny/cache.yaml" in text
    assert not (tmp_path / "r").exists()


def test_none_clears_a_recipe_value(tmp_path):
    recipe = tmp_path / "train.yaml"
    recipe.write_text("train:\n  max_steps: 60\n  lr: 1.0e-3\n")
    assert build_config(TrainConfig, recipe, "train", run=tmp_path).max_steps == 60
    assert build_config(TrainConfig, recipe, "train", run=tmp_path, max_steps="none").max_steps is None
    assert build_config(TrainConfig, recipe, "train", run=tmp_path, max_steps="90").max_steps == 90
    with pytest.raises(UsageError):  # a required number cannot be cleared
        build_config(TrainConfig, recipe, "train", run=tmp_path, lr="none")


def test_progress_without_a_terminal_prints_plain_lines(monkeypatch, capsys):
    monkeypatch.setattr(console, "PLAIN_EVERY_S", 0.2)
    assert not console.console.is_terminal  # pytest captures stderr
    with console.progress("gen-data", total=10, unit="conv", completed=4) as bar:
        time.sleep(0.5)  # nothing advances: the heartbeat still says where the run is
        bar.advance(2, tokens=50)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("gen-data")]
    assert len(lines) >= 3 and lines[0].startswith("gen-data 4/10 (40.0%)") and lines[-1].startswith("gen-data 6/10")


def test_a_resumed_run_rates_this_sessions_work_only():
    bar = console.StageProgress(None, None, completed=5000, plain=("gen-data", 5010, "conv"))
    bar.started -= 10.0  # ten seconds into this session, two conversations done
    bar.advance(2)
    rate = float(re.search(r"([\d.]+) conv/s", bar.line()).group(1))
    assert 0.15 < rate < 0.25


def test_help_shows_value_placeholders_and_required_options():
    import typer.testing

    from eagle3cli.cli import app

    def help_text(cmd: str) -> str:
        r = typer.testing.CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "240"}, prog_name="eagle3")
        assert r.exit_code == 0
        return " ".join(r.stdout.split())

    text = help_text("gen-data")
    assert re.search(r"--target\s+DIR", text) and re.search(r"--num-samples\s+N\|none", text)
    assert "[required: here or in the recipe]" in text
    assert re.search(r"--verify\s+DIR", help_text("cache"))
