"""Every head folder train and export write carries a model card (README.md) whose Hugging Face
metadata parses, with the run's data and recipe; eval rewrites it with the acceptance it measured;
a README.md eagle3 did not write is never touched; the published SmolLM2 head's card is the one its
manifests and the results page's evals render."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_helpers import eval_args
from train_fixtures import REPO, fast_train_config, make_run

from eagle3cli.cli import main
from eagle3cli.head.card import CARD, MARK, card_evals, front_matter
from eagle3cli.run_folder.manifest import write_manifest
from eagle3cli.train.loop import finish, fit, setup

HF_KEYS = {"base_model", "library_name", "tags", "license", "datasets"}


def metadata(folder: Path) -> dict:
    """The card's front matter, parsed with yaml.safe_load as Hugging Face's hub does."""
    text = (folder / CARD).read_text()
    assert text.startswith("---\n") and MARK in text
    meta = yaml.safe_load(text.split("---\n")[1])
    assert isinstance(meta, dict) and HF_KEYS <= set(meta), sorted(meta)
    assert meta == front_matter(text)
    return meta


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target_dir) -> Path:
    """A run trained for 2 steps: RUN/head with its card."""
    run = make_run(tmp_path_factory.mktemp("card") / "run", tiny_target_dir, n=12)
    tr = setup(fast_train_config(run, max_steps=2, log_every=1, save_every=2, ttt_steps=2))
    fit(tr)
    return finish(tr)


def test_trains_head_has_a_card_with_its_data_and_recipe(trained, tiny_target_dir):
    meta = metadata(trained)
    assert meta["base_model"] == str(tiny_target_dir)  # a local folder with no hub id: its path
    assert meta["library_name"] == "sglang" and "eagle3" in meta["tags"] and "speculative-decoding" in meta["tags"]
    assert len(meta["tags"]) == len(set(meta["tags"]))  # the eagle3 layout's tag is not said twice
    assert meta["datasets"] == ["openai/gsm8k"]  # the gen-data folder's source, as a hub id
    assert "eagle3_eval" not in meta  # not evaluated yet
    text = (trained / CARD).read_text()
    data = json.loads((trained.parent / "data" / "manifest.json").read_text())
    assert f"{data['counts']['records']} conversations from" in text and "original answers (not regenerated)" in text
    recipe = yaml.safe_load(text.split("```yaml\n")[1].split("```")[0])["train"]
    manifest = json.loads((trained.parent / "train" / "manifest.json").read_text())
    assert recipe == manifest["config"] and recipe["max_steps"] == 2
    assert f"eagle3 serve --engine sglang --target {tiny_target_dir} --head {trained}" in text
    assert "--speculative-algorithm EAGLE3" in text and "--speculative-config" in text and "-md " in text


def test_a_rerun_of_a_finished_train_writes_a_card_a_kill_cut_off(trained):
    """Killed after train's manifest and before the card: the same command again writes it."""
    from eagle3cli.train.loop import run_train

    kept = (trained / CARD).read_text()
    (trained / CARD).unlink()
    try:
        assert (
            run_train(fast_train_config(trained.parent, max_steps=2, log_every=1, save_every=2, ttt_steps=2)) == trained
        )
        assert metadata(trained)["datasets"] == ["openai/gsm8k"]
    finally:
        (trained / CARD).write_text(kept)


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "speculators"])
def test_each_export_format_has_a_card(tmp_path, trained, fmt):
    out = tmp_path / fmt
    assert main(["export", "--head", str(trained), "--format", fmt, "--out", str(out)]) == 0
    meta = metadata(out)
    assert meta["library_name"] == ("sglang" if fmt == "sglang" else "vllm") and fmt in meta["tags"]
    assert meta["datasets"] == ["openai/gsm8k"]  # followed through the export to the run's data
    text = (out / CARD).read_text()
    assert f"--format {fmt}" in text and f'--speculative-config \'{{"method": "eagle3", "model": "{out}"' in text
    assert ("sglang.launch_server" in text) == (fmt != "speculators")  # SGLang does not load vLLM's speculators layout
    # the same command again resumes into its own folder: the card is one of export's files
    assert main(["export", "--head", str(trained), "--format", fmt, "--out", str(out)]) == 0


def test_a_gguf_exports_card_serves_it_with_llama_cpp(tmp_path, trained):
    """export --format gguf's folder (written here as its manifest says, without llama.cpp)."""
    from eagle3cli.head.write import write_card

    out = tmp_path / "gguf"
    out.mkdir()
    target = json.loads((trained / "manifest.json").read_text())["target"]
    write_manifest(out, "export", format="gguf", source=str(trained), target=target, config={})
    write_card(out)
    meta = metadata(out)
    assert meta["library_name"] == "gguf" and meta["datasets"] == ["openai/gsm8k"]
    text = (out / CARD).read_text()
    assert f"-md {out}/head.gguf --spec-type draft-eagle3" in text and "sglang.launch_server" not in text


def test_eval_writes_its_acceptance_into_the_card_and_export_carries_it(tmp_path, trained, tiny_target_dir):
    args = eval_args(tiny_target_dir, trained, tmp_path / "eval", "--num-prompts", "2", "--depth", "2")
    assert main([*args, "--max-new-tokens", "8", "--mode", "both"]) == 0
    meta = metadata(trained)
    rows = meta["eagle3_eval"]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert [(r["bench"], r["mode"], r["depth"]) for r in rows] == [("gsm8k", "chain", 2), ("gsm8k", "tree", 2)]
    (per_head,) = report["heads"].values()
    assert rows[0]["tau"] == round(per_head["chain"]["acceptance"]["tau"], 3) and len(rows[0]["alpha_by_depth"]) == 2
    command = rows[0]["command"].split()
    assert command[:3] == ["eagle3", "eval", "--target"] and {"--depth", "2", "--mode", "both"} <= set(command)
    index = meta["model-index"][0]["results"]
    assert [r["metrics"][0]["value"] for r in index] == [r["tau"] for r in rows]
    assert "| GSM8K | first | chain | 2 | 0.0 | 2 |" in (trained / CARD).read_text()
    # another bench adds its rows; the same bench again replaces its own
    assert main([*eval_args(tiny_target_dir, trained, tmp_path / "e2", "--num-prompts", "1", "--depth", "2"),
                 "--max-new-tokens", "8", "--bench", "mt_bench"]) == 0  # fmt: skip
    assert [(r["bench"], r["mode"]) for r in card_evals(trained)] == [
        ("gsm8k", "chain"),
        ("gsm8k", "tree"),
        ("mt_bench", "chain"),
    ]
    out = tmp_path / "vllm"
    assert main(["export", "--head", str(trained), "--format", "vllm", "--out", str(out)]) == 0
    assert card_evals(out) == card_evals(trained)  # the same weights: the source's acceptance


def test_eval_never_touches_a_readme_eagle3_did_not_write(tmp_path, trained, tiny_target_dir):
    import shutil

    head = shutil.copytree(trained, tmp_path / "head")
    mine = "# my head\n\nnotes I keep\n"
    (head / CARD).write_text(mine)
    args = eval_args(tiny_target_dir, head, tmp_path / "eval", "--num-prompts", "1", "--depth", "1")
    assert main([*args, "--max-new-tokens", "4"]) == 0
    assert (head / CARD).read_text() == mine


PUBLISHED = REPO / "models" / "smollm2-135m-eagle3"


def test_the_published_heads_card_is_the_one_its_manifests_and_evals_render():
    meta = metadata(PUBLISHED)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["license"] == "apache-2.0"
    assert set(meta["datasets"]) == {"anon8231489123/ShareGPT_Vicuna_unfiltered", "openai/gsm8k"}
    page = json.loads((REPO / "docs" / "results-smollm2.json").read_text())
    mt = next(r for r in meta["eagle3_eval"] if r["bench"] == "mt_bench" and r["mode"] == "chain")
    assert mt["tau"] == page["published"]["mt_bench_tau"]
    r = subprocess.run(
        [sys.executable, "tools/published_card.py", "--check"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "argv",
    [
        [
            "eval",
            "--head",
            "h",
            "--depth",
            "3",
            "--mode",
            "both",
            "--no-generate-baseline",
            "--compare",
            "a",
            "--compare",
            "b",
        ],
        ["eval", "--run", "r", "--bench", "mt_bench", "--max-prompt-tokens", "2048", "--temperature", "1.0"],
        ["train", "--run", "r", "--aux-layers", "1,2,3", "--max-steps", "5", "--online"],
    ],
)
def test_the_command_a_card_shows_rebuilds_the_config(parse, argv):
    """command_line(cfg) is the command that made cfg: parsed again, it gives the same config."""
    import shlex

    from eagle3cli.options import command_line

    cfg = parse(argv)
    shown = command_line(argv[0], cfg)
    assert shown.startswith(f"eagle3 {argv[0]} ") and parse(shlex.split(shown)[1:]) == cfg


def test_the_cards_engine_commands_are_the_ones_serve_builds(tmp_path, trained, tiny_target_dir):
    """The engines' own flags in a card, token for token as eagle3 serve launches them (3 steps, a chain)."""
    import shlex

    from eagle3cli.engines import llama_cpp, sglang, vllm
    from eagle3cli.engines.serving import SpecNumbers

    text = " ".join((trained / CARD).read_text().replace("\\\n", " ").split())
    spec = SpecNumbers(steps=3, topk=1, draft_tokens=4, source="card")
    assert shlex.join(sglang.command(tiny_target_dir, trained, spec, python="python")) in text
    assert shlex.join(["vllm", *vllm.command(tiny_target_dir, trained, spec)[1:]]) in text
    gguf = Path(f"{trained}-gguf")
    assert shlex.join(llama_cpp.command(gguf / "target.gguf", gguf / "head.gguf", spec)) in text
