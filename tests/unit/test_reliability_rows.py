"""Issue 24, rows: any failure on one input row costs that row; generated text is checked like input
text; a run that keeps nothing is an error, not a manifest over nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import err, gen_data_args, wide_console  # noqa: F401  (wide_console: autouse here)
from http_fixtures import FixedAnswerServer

from eagle3cli.cli import main
from eagle3cli.data.formats import parse_input_spec, read_input
from eagle3cli.prompts import load_prompts


def conv(user: str, rid: str) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "ok"}]}


DEEP = '{"id": "deep", "messages": ' + "[" * 5000 + "]" * 5000 + "}"
HUGE = '{"id": "huge", "messages": [{"role": "user", "content": "x"}], "n": ' + "9" * 5000 + "}"
DEEP_TOOL = json.dumps(
    {
        "id": "tool",
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}],
            },
        ],
    }
)


# ---------------------------------------------------------------- 2. one bad row
@pytest.mark.parametrize("layout", ["jsonl", "array"])
def test_a_row_beyond_pythons_json_limits_costs_that_row(tmp_path, layout):
    good = [json.dumps(conv("first", "a")), json.dumps(conv("last", "z"))]
    rows = [good[0], DEEP, HUGE, DEEP_TOOL, good[1]]
    path = tmp_path / ("in.jsonl" if layout == "jsonl" else "in.json")
    path.write_text("\n".join(rows) + "\n" if layout == "jsonl" else "[\n" + ",\n".join(rows) + "\n]\n")
    r = read_input(parse_input_spec(str(path)))
    assert [x["id"] for x in r.records] == ["in:a", "in:z"]
    reasons = [(x["row"] if layout == "jsonl" else x["row"], x["reason"]) for x in r.rejects]
    assert [reason for _, reason in reasons] == ["malformed_json", "malformed_json", "malformed_row"], r.rejects
    assert "nested too deeply" in r.rejects[0]["detail"] and "4300" in r.rejects[1]["detail"]
    # eval --bench and serve-bench --prompts read through the same reader
    assert [i for i, _ in load_prompts(str(path), 10)] == ["in:a", "in:z"]


def test_gen_data_completes_over_a_file_with_rows_beyond_the_limits(tmp_path, tiny_target_dir, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([json.dumps(conv("first", "a")), DEEP, HUGE]) + "\n")
    out = tmp_path / "data"
    args = gen_data_args(tiny_target_dir, out, "--input", str(src), "--no-regenerate")
    assert main(args) == 0
    err(capsys)
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 1 and m["counts"]["skipped_by_reason"] == {"malformed_json": 2}


def openai_gen(target, src: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [
        "gen-data",
        "--target",
        str(target),
        "--input",
        str(src),
        "--out",
        str(out),
        "--backend",
        "openai",
        "--endpoint",
        url,
        "--max-new-tokens",
        "4",
        "--retries",
        "0",
        *extra,
    ]


def prompts_file(tmp_path: Path, n: int = 3) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}?"}) + "\n" for i in range(n)))
    return p


# ---------------------------------------------------------------- 3. a lone surrogate in an answer
def test_a_lone_surrogate_in_a_generated_answer_rejects_that_conversation(tmp_path, tiny_target_dir, capsys):
    bad, good = FixedAnswerServer("lone \ud800"), FixedAnswerServer("a fine answer")
    try:
        src, out = prompts_file(tmp_path), tmp_path / "data"
        assert main(openai_gen(tiny_target_dir, src, out, bad.url)) == 2  # nothing kept (defect 8)
        text = err(capsys)
        assert "kept no conversation" in text and "invalid_unicode: 3" in text
        rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]
        assert {r["reason"] for r in rejects} == {"invalid_unicode"} and not (out / "manifest.json").exists()
        assert main(openai_gen(tiny_target_dir, src, out, bad.url)) == 2  # the rerun does not crash either
        err(capsys)
        assert main(openai_gen(tiny_target_dir, src, out, good.url)) == 0  # and the folder is still usable
        err(capsys)
        assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 3
    finally:
        bad.stop()
        good.stop()


# ---------------------------------------------------------------- 8. nothing written is an error
def test_a_run_that_keeps_nothing_exits_2_with_the_reasons(tmp_path, tiny_target_dir, capsys):
    empty = FixedAnswerServer("")
    try:
        src, out = prompts_file(tmp_path), tmp_path / "data"
        assert main(openai_gen(tiny_target_dir, src, out, empty.url)) == 2
        text = err(capsys)
        assert "kept no conversation" in text and "empty_generation: 3" in text and "endpoint answers" in text
        assert not (out / "manifest.json").exists() and (out / "rejects.jsonl").exists()
    finally:
        empty.stop()
    # prompts too long for the limit: every one rejected, exit 2 (the hf backend)
    args = ["gen-data", "--target", str(tiny_target_dir), "--input", str(src), "--max-new-tokens", "2"]
    assert main([*args, "--out", str(tmp_path / "d2"), "--max-prompt-tokens", "3"]) == 2
    text = err(capsys)
    assert "prompt_too_long: 3" in text and "raise --max-prompt-tokens" in text
    for bad in ("0", "-5"):
        assert main([*args, "--out", str(tmp_path / "d3"), "--max-prompt-tokens", bad]) == 2
        assert f"--max-prompt-tokens must be an integer >= 1, got {bad}" in err(capsys)


def test_a_huge_prompt_is_rejected_by_its_size_before_it_is_tokenised(tmp_path, tiny_target_dir, capsys):
    src = tmp_path / "in.jsonl"
    rows = [{"id": "huge", "prompt": "word " * 2_000_000}, {"id": "fine", "prompt": "a short question?"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "data"
    args = ["gen-data", "--target", str(tiny_target_dir), "--input", str(src), "--out", str(out)]
    assert main([*args, "--max-new-tokens", "2", "--max-prompt-tokens", "64"]) == 0
    err(capsys)
    (reject,) = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert reject["id"] == "in:huge" and reject["reason"] == "prompt_too_long"
    assert "10,000,0" in reject["detail"] and "characters" in reject["detail"]  # its size, not a token count
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 1
