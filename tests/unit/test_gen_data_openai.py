"""The openai backend against our real HTTP server (127.0.0.1, backed by the tiny target):
regenerates multi-turn conversations, survives injected 5xx and timeouts, and leaves a record
whose retries run out pending (not rejected) for the rerun to complete."""

from __future__ import annotations

import json

import httpx
import pytest

from eagle3cli.data.config import GenDataConfig
from eagle3cli.data.run import run_gen_data
from eagle3cli.engines.local_engine import free_port
from eagle3cli.errors import IncompleteError


@pytest.fixture
def mt_input(tmp_path):
    p = tmp_path / "mt.jsonl"
    p.write_text(
        "".join(json.dumps({"question_id": i, "turns": [f"Question {i}?", f"Follow-up {i}?"]}) + "\n" for i in range(4))
    )
    return p


def _cfg(target, inputs, out, endpoints, **kw):
    base = dict(
        target=str(target),
        inputs=(str(inputs),),
        out=out,
        backend="openai",
        endpoints=tuple(endpoints),
        max_new_tokens=6,
        temperature=0.0,
        concurrency=4,
        timeout_s=6.0,
        retries=6,
        backoff_s=0.05,
    )
    base.update(kw)
    return GenDataConfig(**base)


def _records(out):
    return [json.loads(line) for f in sorted(out.glob("shard-*.jsonl")) for line in f.read_text().splitlines()]


def test_server_endpoints(model_server):
    srv = model_server()
    assert httpx.get(f"{srv.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"] == "tiny"
    chat = httpx.post(
        f"{srv.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0},
    ).json()
    assert chat["choices"][0]["finish_reason"] in ("stop", "length") and chat["usage"]["completion_tokens"] <= 3
    gen = httpx.post(
        f"{srv.url}/generate",
        json={
            "text": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        },
    ).json()
    assert gen["text"] == chat["choices"][0]["message"]["content"]  # same template, same greedy text
    assert gen["meta_info"]["completion_tokens"] == chat["usage"]["completion_tokens"]
    assert gen["meta_info"]["finish_reason"]["type"] == chat["choices"][0]["finish_reason"]
    assert httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": []}).status_code == 400


def test_openai_backend_regenerates_and_survives_5xx_and_timeouts(model_server, tiny_target_dir, mt_input, tmp_path):
    srv = model_server(fail_first=3, sleep_first=1, sleep_s=9.0)  # 9 s > the 6 s client timeout
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connect errors, retried on the live one
    out = run_gen_data(_cfg(tiny_target_dir, mt_input, tmp_path / "data", [srv.url, dead]))
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 4 and m["counts"]["skipped"] == 0 and m["backend"] == "openai"
    recs = _records(out)
    assert all([x["role"] for x in r["messages"]] == ["user", "assistant"] * 2 for r in recs)
    # on-policy: each turn-2 request carried the regenerated turn-1 answer
    ok_chats = [r["body"]["messages"] for r in srv.requests]
    for r in recs:
        turn2 = [msgs for msgs in ok_chats if len(msgs) == 3 and msgs[0]["content"] == r["messages"][0]["content"]]
        assert turn2 and all(msgs[1]["content"] == r["messages"][1]["content"] for msgs in turn2)
    assert len(srv.requests) >= 8 + 3 + 1  # 8 turns + 3 injected 500s + 1 timed-out request


def test_openai_backend_leaves_failed_records_pending_and_the_rerun_completes(
    model_server, tiny_target_dir, mt_input, tmp_path
):
    srv = model_server(fail_first=2)  # with retries=1: the first record's first turn fails twice
    cfg = _cfg(tiny_target_dir, mt_input, tmp_path / "data", [srv.url], retries=1, concurrency=1)
    with pytest.raises(IncompleteError, match="pending after endpoint failures") as e:
        run_gen_data(cfg)
    assert e.value.exit_code == 3 and "HTTP 500" in str(e.value)
    assert not (tmp_path / "data" / "manifest.json").exists()  # an unfinished folder, never "complete"
    out = run_gen_data(cfg)  # the server answers now: the rerun regenerates what was pending
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 4 and m["counts"]["skipped"] == 0
    assert (out / "rejects.jsonl").read_text() == ""


def test_openai_backend_streams_across_shards_and_writes_each_shard_whole(model_server, tiny_target_dir, tmp_path):
    """Every shard's conversations go out in one stream (no drain at each shard's tail); the shards
    written are the same bytes as a one-shard-at-a-time run of the same plan."""
    p = tmp_path / "q.jsonl"
    p.write_text(
        "".join(json.dumps({"question_id": i, "turns": [f"Tell me about item {i}."]}) + "\n" for i in range(9))
    )
    # the server holds its first four answers 2 s each, so what is in flight then is what the client
    # sent, not how fast this machine answered (a loaded CI box answered the first before the third went)
    srv = model_server(sleep_first=4, sleep_s=2.0)
    out = run_gen_data(_cfg(tiny_target_dir, p, tmp_path / "a", [srv.url], shard_size=2, concurrency=4))
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 9 and len(m["shards"]) == 5
    # requests of later shards were sent before earlier shards had all answered: at the start, four
    # conversations (two shards' worth) were in flight together; a drain per shard would hold 2
    assert srv.max_in_flight >= 3
    one = run_gen_data(_cfg(tiny_target_dir, p, tmp_path / "b", [srv.url], shard_size=2, concurrency=1))
    for k in range(5):
        name = f"shard-{k:05d}.jsonl"
        assert (out / name).read_bytes() == (one / name).read_bytes()


def test_a_conversation_keeps_its_slot_for_all_its_turns(model_server, tiny_target_dir, mt_input, tmp_path):
    """With C conversations in flight, a conversation's second turn goes out before later conversations'
    first turns (a slot per request would send every first turn of the run before any second one, so
    no conversation, and no shard, would finish until the end)."""
    srv = model_server()
    run_gen_data(_cfg(tiny_target_dir, mt_input, tmp_path / "d", [srv.url], concurrency=2, shard_size=1))
    turns = [len(r["body"]["messages"]) for r in srv.requests]  # 1: a first turn, 3: a second turn
    assert turns.count(1) == 4 and turns.count(3) == 4
    assert turns.index(3) <= 2  # at most C first turns before the first second turn
