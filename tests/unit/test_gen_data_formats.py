"""gen-data input formats: every accepted shape parses to the normalised schema; every bad-record
kind is rejected with its reason; a file in no known shape exits 2."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import gen_data_args

from eagle3cli.cli import main
from eagle3cli.data.formats import BadRecord, check_messages, parse_input_spec, read_input
from eagle3cli.data.mixture import build_plan, quotas
from eagle3cli.errors import UsageError


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _read(path: Path):
    return read_input(parse_input_spec(str(path)))


def test_sharegpt_json_array_and_jsonl(tmp_path):
    rows = [
        {
            "id": "a",
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello"},
                {"from": "human", "value": "Bye"},
            ],
        }
    ]
    arr = tmp_path / "sg.json"
    arr.write_text(json.dumps(rows))
    for path in (arr, _jsonl(tmp_path / "sg.jsonl", rows)):
        res = _read(path)
        assert res.shape == "sharegpt" and not res.rejects
        (rec,) = res.records
        assert rec["id"] == f"{path.stem}:a" and rec["source"] == path.stem
        assert [m["role"] for m in rec["messages"]] == ["system", "user", "assistant", "user"]
        assert rec["messages"][1]["content"] == "Hi"


def test_bundled_sharegpt_and_mtbench_and_gsm8k(bundled_data):
    sg = _read(bundled_data / "sharegpt_sample.json")
    assert sg.shape == "sharegpt" and len(sg.records) == sg.rows and sg.rows > 100
    mt = _read(bundled_data / "mt_bench_questions.jsonl")
    assert mt.shape == "mt-bench" and len(mt.records) == 80
    assert [m["role"] for m in mt.records[0]["messages"]] == ["user", "user"]
    assert mt.records[0]["meta"]["source_category"] == "writing"
    gs = _read(bundled_data / "gsm8k_test.jsonl")
    assert gs.shape == "gsm8k" and len(gs.records) == 1319
    assert [m["role"] for m in gs.records[0]["messages"]] == ["user", "assistant"]


def test_ultrachat_messages_and_data_forms(tmp_path):
    msgs = _read(
        _jsonl(
            tmp_path / "uc.jsonl",
            [
                {
                    "prompt_id": "p1",
                    "prompt": "Q?",
                    "messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}],
                }
            ],
        )
    )
    assert msgs.shape == "messages" and msgs.records[0]["id"] == "uc:p1"
    data = _read(_jsonl(tmp_path / "uc_orig.jsonl", [{"id": 7, "data": ["Q1", "A1", "Q2", "A2"]}]))
    assert data.shape == "ultrachat"
    assert [m["role"] for m in data.records[0]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert data.records[0]["id"] == "uc_orig:7"


def test_prompt_jsonl_and_parquet(tmp_path):
    res = _read(_jsonl(tmp_path / "p.jsonl", [{"prompt": "Tell me a joke"}, {"prompt": "x", "response": "y"}]))
    assert res.shape == "prompt"
    assert res.records[0]["messages"] == [{"role": "user", "content": "Tell me a joke"}]
    assert res.records[1]["messages"][1] == {"role": "assistant", "content": "y"}
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]),
        tmp_path / "g.parquet",
    )
    pres = _read(tmp_path / "g.parquet")
    assert pres.shape == "gsm8k" and len(pres.records) == 2 and pres.records[1]["messages"][0]["content"] == "2+2?"


def test_every_bad_record_kind_is_rejected_with_its_reason(tmp_path):
    good = {"messages": [{"role": "user", "content": "fine"}, {"role": "assistant", "content": "ok"}]}
    rows = [
        good,
        '{"messages": [',  # malformed_json
        {"messages": [{"role": "user"}]},  # missing_fields
        {"prompt": "no messages key"},  # missing_fields
        {"messages": [{"role": "wizard", "content": "x"}]},  # unknown_role
        {"messages": [{"role": "user", "content": "   "}]},  # empty_content
        {"messages": [{"role": "user", "content": ["a", "list"]}]},  # non_string_content
        {"messages": [{"role": "system", "content": "sys"}, {"role": "assistant", "content": "a"}]},  # no_user_turn
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "system", "content": "b"},
                {"role": "assistant", "content": "c"},
            ]
        },  # wrong_role_order: a system turn after the start is not repaired
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "tool", "content": "r"},
                {"role": "assistant", "content": "b"},
            ]
        },  # wrong_role_order
    ]
    res = _read(_jsonl(tmp_path / "bad.jsonl", rows))
    assert len(res.records) == 1
    reasons = [r["reason"] for r in res.rejects]
    assert reasons == [
        "malformed_json",
        "missing_fields",
        "missing_fields",
        "unknown_role",
        "empty_content",
        "non_string_content",
        "no_user_turn",
        "wrong_role_order",
        "wrong_role_order",
    ]
    assert all(r["detail"] and r["source"] == "bad" for r in res.rejects)
    sg = _read(
        _jsonl(
            tmp_path / "sg.jsonl",
            [
                {"conversations": [{"from": "human", "value": "hi"}]},
                {"conversations": [{"from": "robot", "value": "hi"}]},
                {"conversations": [{"value": "hi"}]},
            ],
        )
    )
    assert [r["reason"] for r in sg.rejects] == ["unknown_role", "missing_fields"]


def test_check_messages_allows_prompt_only_multi_user():
    check_messages([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(BadRecord, match="wrong_role_order"):
        check_messages([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])


def test_unknown_format_file_is_a_usage_error_exit_2(tmp_path, tiny_target_dir, capsys):
    csv = tmp_path / "table.csv"
    csv.write_text("a,b\n1,2\n")
    odd = _jsonl(tmp_path / "odd.jsonl", [{"text": "x", "label": 1}])
    for path in (csv, odd):
        with pytest.raises(UsageError, match="not in any known format"):
            _read(path)
        rc = main(gen_data_args(tiny_target_dir, tmp_path / "o", "--input", str(path)))
        assert rc == 2
        err = " ".join(capsys.readouterr().err.split())  # rich wraps lines
        assert "not in any known format" in err and "ShareGPT" in err
    assert not (tmp_path / "o").exists()
    assert main(gen_data_args(tiny_target_dir, tmp_path / "o", "--input", str(tmp_path / "missing.jsonl"))) == 2


def test_hf_dataset_offline_is_a_clear_usage_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    spec = parse_input_spec("hf:no-such-org/no-such-dataset:train:0.5")
    assert (spec.hf_name, spec.hf_config, spec.hf_split, spec.weight) == (
        "no-such-org/no-such-dataset",
        None,
        "train",
        0.5,
    )
    with pytest.raises(UsageError, match="could not be loaded"):
        read_input(spec)


def test_input_spec_weights(tmp_path):
    p = _jsonl(tmp_path / "d.jsonl", [{"prompt": "x"}])
    assert parse_input_spec(f"{p}:0.25").weight == 0.25 and parse_input_spec(str(p)).weight == 1.0
    with pytest.raises(UsageError, match="weight"):
        parse_input_spec(f"{p}:0")


def test_mixture_quotas_dedup_and_seeded_shuffle(tmp_path):
    a = _read(_jsonl(tmp_path / "a.jsonl", [{"prompt": f"question {i}"} for i in range(40)]))
    # b repeats two of a's prompts up to case and whitespace: deduplicated by normalised first prompt
    b = _read(
        _jsonl(
            tmp_path / "b.jsonl",
            [{"prompt": f"other {i}"} for i in range(40)] + [{"prompt": "QUESTION   1"}, {"prompt": " question 2 "}],
        )
    )
    b.spec = replace(b.spec, weight=3.0)
    plan, dups = build_plan([a, b], num_samples=20, seed=1)
    assert len(plan) == 20
    assert sum(r["source"] == "a" for r in plan) == 5 and sum(r["source"] == "b" for r in plan) == 15
    full, dups = build_plan([a, b], num_samples=None, seed=1)
    assert len(full) == 80 and sorted(d["reason"] for d in dups) == ["duplicate", "duplicate"]
    again, _ = build_plan([a, b], num_samples=20, seed=1)
    other, _ = build_plan([a, b], num_samples=20, seed=2)
    assert [r["id"] for r in again] == [r["id"] for r in plan]
    assert [r["id"] for r in other] != [r["id"] for r in plan]
    assert quotas([100, 2], [1, 1], 10) == [5, 2]


@pytest.mark.parametrize("recipe", ["recipes/tiny/gen-data.yaml", "recipes/llama3-8b/gen-data.yaml"])
def test_gen_data_recipes_load_into_the_config(recipe):
    from eagle3cli.config import build_config
    from eagle3cli.data.config import GenDataConfig

    repo = Path(__file__).resolve().parents[2]
    cfg = build_config(GenDataConfig, repo / recipe, "gen_data", run=Path("runs/x"))
    assert cfg.target and cfg.inputs and cfg.out_dir == Path("runs/x/data")
    assert cfg.backend == ("openai" if "8b" in recipe else "hf")


def test_config_errors_are_reported_together(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("backend: vllm\n")  # a flag's choices are checked by the parser; a recipe's here
    rc = main(
        [
            "gen-data",
            "--recipe",
            str(recipe),
            "--input",
            "x.jsonl",
            "--temperature",
            "-1",
            "--top-p",
            "0",
            "--batch-size",
            "0",
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2
    for needle in (
        "--target is required",
        "--run runs/NAME",
        "--backend 'vllm': expected one of hf, openai",
        "--temperature",
        "--top-p",
        "--batch-size",
    ):
        assert needle in err
    assert main(["gen-data", "--target", "t", "--input", "x", "--out", str(tmp_path), "--endpoint", "http://h:1"]) == 2
    assert "add --backend openai" in " ".join(capsys.readouterr().err.split())
    assert main(["gen-data", "--backend", "vllm"]) == 2
    assert "'vllm' is not one of" in " ".join(capsys.readouterr().err.split())


def test_turn_order_repairs_keep_the_conversation_and_are_counted(tmp_path):
    sg = [
        {
            "conversations": [
                {"from": "gpt", "value": "Hi!"},
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": "a"},
            ]
        }
    ]
    msgs = [
        {
            "messages": [
                {"role": "user", "content": "u1"},
                {"role": "user", "content": "u2"},
                {"role": "assistant", "content": "a1"},
                {"role": "assistant", "content": "a2"},
            ]
        }
    ]
    (a,) = _read(_jsonl(tmp_path / "sg.jsonl", sg)).records
    assert a["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert a["meta"]["repairs"] == ["dropped_leading_assistant"]
    res = _read(_jsonl(tmp_path / "msgs.jsonl", msgs))
    (b,) = res.records
    assert b["messages"] == [{"role": "user", "content": "u1\n\nu2"}, {"role": "assistant", "content": "a1\n\na2"}]
    assert b["meta"]["repairs"] == ["merged_user_turns", "merged_assistant_turns"]
    assert res.repair_counts == {"merged_user_turns": 1, "merged_assistant_turns": 1}
    # prompt-only (MT-bench's two questions, answered in order): not merged
    (c,) = _read(_jsonl(tmp_path / "mt.jsonl", [{"turns": ["first", "second"]}])).records
    assert [m["role"] for m in c["messages"]] == ["user", "user"] and "repairs" not in c["meta"]
