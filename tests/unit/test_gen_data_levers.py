"""gen-data's data levers on tiny targets: prompts the target writes itself (hf and openai backends,
the same text), K answers per prompt with identical answers counted once, augmented prompts, the
chitchat shape, the written-prompt filters, and MinHash near-duplicate removal (deterministic and
idempotent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3cli.cli import main
from eagle3cli.data import dedup, levers
from eagle3cli.data.formats import parse_input_spec, read_input
from eagle3cli.readers.sources import _chitchat_row, bundled

GSM8K_TEST = bundled("gsm8k_test.jsonl")


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("shard-*.jsonl")) for line in f.read_text().splitlines()]


def _base(target, out, *extra) -> list[str]:
    return ["gen-data", "--target", str(target), "--max-new-tokens", "6", "--seed", "1", "--out", str(out), *extra]


SYNTH = [
    "--keep-eval",
    "--synthetic",
    "8",
    "--synth-min-words",
    "1",
    "--synth-max-tokens",
    "48",
    "--synth-temperature",
    "0.9",
]


def test_synthetic_prompts_are_written_by_the_target_then_answered(trained_target_dir, tmp_path):
    # the committed trained target ends its turns (a random one never writes its end-of-turn)
    out = tmp_path / "syn"
    assert main(_base(trained_target_dir, out, *SYNTH, "--temperature", "0")) == 0
    m = json.loads((out / "manifest.json").read_text())
    recs = _records(out)
    rejected = sum(m["counts"]["skipped_by_reason"].values()) if m["counts"]["skipped_by_reason"] else 0
    assert len(recs) + rejected == 8 and m["levers"]["synthetic"]["planned"] == 8
    assert m["levers"]["synthetic"]["written"] == len(recs) >= 1
    for r in recs:
        assert r["id"].startswith("synthetic:") and r["source"] == "synthetic"
        user, answer = r["messages"]
        assert user["role"] == "user" and user["content"].strip() and answer["role"] == "assistant"
        assert len(r["meta"]["turns"]) == 1 and len(r["meta"]["written_user_turns"]) == 1
    # the user turns differ (sampled per record id), and a rerun of the finished folder is a no-op
    assert len({r["messages"][0]["content"] for r in recs}) == len(recs)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(_base(trained_target_dir, out, *SYNTH, "--temperature", "0")) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.slow
def test_the_openai_backend_writes_the_same_prompts_through_v1_completions(trained_target_dir, tmp_path):
    from eagle3cli.data.http_server import ModelServer
    from eagle3cli.model.target import load_target

    srv = ModelServer(*load_target(trained_target_dir)[:2], served_model_name="tiny")
    srv.start("127.0.0.1", 0)
    hf, api = tmp_path / "hf", tmp_path / "api"
    greedy = [*SYNTH, "--synth-temperature", "0", "--temperature", "0", "--synth-turns", "2"]
    try:
        assert main(_base(trained_target_dir, hf, *greedy)) == 0
        assert main(_base(trained_target_dir, api, *greedy, "--backend", "openai", "--endpoint", srv.url)) == 0
    finally:
        srv.stop()
    assert any(r["path"] == "/v1/completions" for r in srv.requests)
    strip = lambda rs: [(r["id"], r["messages"]) for r in rs]  # noqa: E731
    assert strip(_records(hf)) == strip(_records(api)) and _records(hf)


def test_several_answers_per_prompt_count_identical_answers_once(tiny_target_dir, tmp_path):
    out = tmp_path / "k"
    args = ["--input", str(GSM8K_TEST), "--keep-eval", "--num-samples", "3", "--answers-per-prompt", "3"]
    assert main(_base(tiny_target_dir, out, *args, "--answer-temperatures", "0,0,1.0")) == 0
    recs, m = _records(out), json.loads((out / "manifest.json").read_text())
    # two greedy answers per prompt are the same text: the second is dropped; the sampled one stays
    assert m["counts"]["skipped_by_reason"].get("duplicate_answer") == 3 and len(recs) == 6
    assert sorted({r["id"].rsplit("#", 1)[1] for r in recs}) == ["k0", "k2"]
    assert {r["meta"]["temperature"] for r in recs} == {0.0, 1.0}
    assert m["levers"]["answers"] == {"per_prompt": 3, "temperatures": [0.0, 0.0, 1.0], "written": 6}
    assert main(_base(tiny_target_dir, tmp_path / "bad", *args, "--answer-temperatures", "0,1")) == 2


def test_augmented_prompts_append_one_seeded_redirect(tiny_target_dir, tmp_path):
    augs = tmp_path / "augs.yaml"
    augs.write_text("augmentations:\n  - {name: fr, text: Answer in French.}\n  - {name: short, text: Be brief.}\n")
    out = tmp_path / "aug"
    args = ["--input", str(GSM8K_TEST), "--keep-eval", "--num-samples", "8", "--augment", str(augs)]
    assert main(_base(tiny_target_dir, out, *args, "--temperature", "0")) == 0
    recs = _records(out)
    assert len(recs) == 8
    for r in recs:
        name = r["meta"]["augmentation"]
        assert r["id"] == f"{r['meta']['augmented_from']}+{name}"
        assert r["messages"][0]["content"].endswith({"fr": "Answer in French.", "short": "Be brief."}[name])
    bad = tmp_path / "bad.yaml"
    bad.write_text("augmentations: [{name: 'Bad Name', text: x}]\n")
    assert main(_base(tiny_target_dir, tmp_path / "x", *args[:-1], str(bad))) == 2


def test_a_written_prompt_is_checked_for_length_loops_cuts_and_eval_prompts():
    eval_text = "Compose an engaging travel blog post about a recent trip to Hawaii"
    check = levers.UserTurnCheck(
        min_words=3, eval_match=lambda r: "mt_bench" if "Hawaii" in r["messages"][0]["content"] else None
    )
    assert check.reason("How do I sort a list in Python?", "stop") is None
    assert check.reason("Hi there", "stop")[0] == "synth_too_short"
    assert check.reason("what is the " * 12, "stop")[0] == "synth_repetitive"
    assert check.reason("How do I sort a list in", "length")[0] == "synth_cut"
    assert check.reason(eval_text, "stop")[0] == "eval_prompt"


def test_near_duplicates_are_dropped_in_plan_order_and_the_pass_is_idempotent(tmp_path):
    out = tmp_path / "data"
    (out / "progress").mkdir(parents=True)
    base = "Explain how photosynthesis turns sunlight water and carbon dioxide into sugar in plant leaves"

    def rec(i, text):
        return {"id": f"synthetic:{i}", "source": "synthetic", "messages": [{"role": "user", "content": text},
                {"role": "assistant", "content": "ok"}], "meta": {"row": i, "write_user": [0]}}  # fmt: skip

    shards = [
        [rec(0, base), rec(1, "Write a haiku about the sea at night and the moon")],
        [rec(2, base + " please"), rec(3, "List three prime numbers larger than one hundred and explain why")],
    ]
    for k, rs in enumerate(shards):
        (out / f"shard-{k:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    ref = [("eval:mt_bench:test", "List three prime numbers larger than one hundred and explain why")]
    first = dedup.dedup_folder(out, [0, 1], ref, 0.7)
    assert {(d["id"], d["reason"]) for d in first} == {
        ("synthetic:2", "near_duplicate"),
        ("synthetic:3", "eval_prompt"),
    }
    assert [r["id"] for r in _records(out)] == ["synthetic:0", "synthetic:1"]
    before = {p.name: p.read_bytes() for p in out.glob("shard-*")}
    assert dedup.dedup_folder(out, [0, 1], ref, 0.7) == first  # a rerun (after a kill) finds the same
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == before


def test_a_second_folder_takes_the_rest_of_a_source_with_dedup_against(tiny_target_dir, tmp_path):
    first, rest = tmp_path / "first", tmp_path / "rest"
    args = ["--input", str(GSM8K_TEST), "--keep-eval", "--temperature", "0"]
    assert main(_base(tiny_target_dir, first, *args, "--num-samples", "4")) == 0
    assert main(_base(tiny_target_dir, rest, *args, "--num-samples", "6", "--dedup-against", str(first))) == 0
    held = {r["messages"][0]["content"] for r in _records(first)}
    grown = _records(rest)
    assert len(held) == 4 and len(grown) == 6 and not held & {r["messages"][0]["content"] for r in grown}
    m = json.loads((rest / "manifest.json").read_text())
    assert m["counts"]["skipped_by_reason"]["in_corpus"] == 4
    # a human-prompt run checks its --dedup-against folders before it writes anything, as --synthetic does
    assert main(_base(tiny_target_dir, tmp_path / "o", *args, "--dedup-against", str(tmp_path / "none"))) == 2
    assert not (tmp_path / "o").exists()


def test_chitchat_conversations_become_alternating_turns(tmp_path):
    raw = {
        "c1": {"messages": [[{"text": "Hello"}, {"text": "how are you?"}], [{"text": "fine"}], [{"text": "cool"}]]},
        "c2": {"messages": [[{"text": "hey"}], [{"text": "  "}]]},
    }
    p = tmp_path / "dataset.json"
    p.write_text(json.dumps(raw))
    spec = parse_input_spec(str(p))
    from dataclasses import replace

    result = read_input(replace(spec, transform=_chitchat_row))
    assert [r["id"] for r in result.records] == ["dataset:c1"] or [r["meta"]["row"] for r in result.records] == [0]
    msgs = result.records[0]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[0]["content"] == "Hello how are you?"
    assert [r["reason"] for r in result.rejects] == ["empty_content"]


@pytest.mark.parametrize(
    "flag",
    [
        ["--synthetic", "-1"],
        ["--near-dup-threshold", "nan"],
        ["--augment-fraction", "0"],
        ["--dedup-against", "no/such"],
    ],
)
def test_bad_lever_settings_exit_2(tiny_target_dir, tmp_path, flag):
    assert main(_base(tiny_target_dir, tmp_path / "o", "--keep-eval", "--synthetic", "2", *flag)) == 2
    assert not (tmp_path / "o").exists()  # refused before anything is written
