"""Issue 64 (reliability round 6): no write through a link out of the run or over a user's files in
any stage, hand-edited files of the wrong shape, non-regular files, numbers a server reports, bombs in
secondary readers, a tokenizer that disagrees with its target, and numeric options without bounds."""

from __future__ import annotations

import json
import os

import pytest
from head_fixtures import make_head
from train_fixtures import copy_run, make_run

from eagle3cli.cli import main

FAST = ["--token-budget", "640", "--max-length", "160", "--ttt-steps", "2", "--log-every", "1"]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich would wrap long paths inside the messages we check


def err(capsys) -> str:
    cap = capsys.readouterr()
    text = " ".join((cap.out + cap.err).split())
    assert "Traceback" not in text
    return text


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_target_dir):
    return make_run(tmp_path_factory.mktemp("r6-train") / "base", tiny_target_dir, n=24)


@pytest.fixture
def run_dir(tmp_path, base_run):
    return copy_run(base_run, tmp_path / "run")


# ---------------------------------------------------------------- 1. no write over a user's files
def _users_head(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"my": "head"}\n')
    (folder / "model.safetensors").write_bytes(b"my weights")
    return folder


def _users_notes(folder):
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    return folder


@pytest.mark.parametrize(
    "case",
    [
        "head-link-to-users-head",
        "head-holding-users-head",
        "head-holding-foreign-files",
        "head-link-to-users-notes",
        "train-link-to-users-folder",
    ],
)
def test_train_never_writes_over_a_users_files(run_dir, tmp_path, capsys, case):
    """RUN/head (or RUN/train) a link out of the run to a folder of the user's, or a plain head/
    holding files eagle3 did not write: exit 2 before training, every file kept."""
    sub, kind = case.split("-", 1)
    theirs = tmp_path / "mine"
    make = _users_head if "users-head" in kind else _users_notes
    if kind.startswith("link"):
        make(theirs)
        os.symlink(theirs, run_dir / sub)
    else:
        theirs = make(run_dir / sub)
    before = snapshot(theirs)
    assert main(["train", "--run", str(run_dir), *FAST, "--max-steps", "2"]) == 2
    text = err(capsys)
    assert "did not write" in text and str(run_dir / sub) in text and "--run runs/OTHER" in text
    assert snapshot(theirs) == before
    assert not (run_dir / "train" / "checkpoints").exists() or sub == "train"


def test_a_link_to_an_empty_folder_or_a_head_of_ours_is_followed(run_dir, tmp_path, capsys):
    """The deliberate case stays open: a stage's folder linked to an empty folder on a bigger disk."""
    elsewhere = tmp_path / "disk" / "head"
    elsewhere.mkdir(parents=True)
    os.symlink(elsewhere, run_dir / "head")
    assert main(["train", "--run", str(run_dir), *FAST, "--max-steps", "2", "--save-every", "2"]) == 0
    assert json.loads((elsewhere / "manifest.json").read_text())["stage"] == "head"
    assert not (elsewhere / ".eagle3-writing").exists()
    assert main(["train", "--run", str(run_dir), *FAST, "--max-steps", "2", "--save-every", "2"]) == 0
    err(capsys)


@pytest.fixture(scope="module")
def head(tmp_path_factory, tiny_target_dir):
    return make_head(tiny_target_dir, tmp_path_factory.mktemp("r6-head") / "head")


@pytest.mark.parametrize("names", [("report.json",), ("shard-00000.safetensors", "vocab.safetensors"), ("notes.txt",)])
def test_cache_and_eval_refuse_a_link_out_to_a_users_folder(run_dir, tmp_path, head, capsys, names):
    """Files of the stage's own names in a folder a link leads to (no manifest, no record of a run of
    ours) are a user's: refused, where a plain folder of ours killed mid-run would be resumed."""
    theirs = tmp_path / "mine"
    theirs.mkdir()
    for n in names:
        (theirs / n).write_text("mine\n")
    before = snapshot(theirs)
    os.symlink(theirs, run_dir / "cache2")
    assert main(["cache", "--data", str(run_dir / "data"), "--out", str(run_dir / "cache2")]) == 2
    assert "did not write" in err(capsys)
    os.symlink(theirs, run_dir / "eval")
    assert main(["eval", "--head", str(head), "--out", str(run_dir / "eval"), "--num-prompts", "1"]) == 2
    assert "did not write" in err(capsys)
    assert snapshot(theirs) == before


# ---------------------------------------------------------------- 2. hand-edited files of the wrong shape
def _edit_json(path, edit):
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda c: c.__setitem__("eagle3", "not an object"), "eagle3"),
        (lambda c: c["eagle3"].__setitem__("target", [1, 2]), "eagle3.target"),
        (lambda c: c.__setitem__("eagle_config", 7), "eagle_config"),
        (lambda c: c.__setitem__("speculators_config", {"verifier": "x"}), "speculators_config.verifier"),
    ],
)
def test_a_head_config_of_the_wrong_shape_exits_2_in_eval_export_and_serve(
    tmp_path, head, tiny_target_dir, capsys, edit, field
):
    bad = tmp_path / "bad-head"
    bad.mkdir()
    for f in head.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    _edit_json(bad / "config.json", edit)
    for argv in (
        ["eval", "--head", str(bad), "--out", str(tmp_path / "ev"), "--num-prompts", "1"],
        ["export", "--head", str(bad), "--format", "vllm", "--out", str(tmp_path / "ex")],
        ["serve", "--head", str(bad), "--target", str(tiny_target_dir), "--dry-run"],
    ):
        assert main(argv) == 2, argv
        text = err(capsys)
        assert str(bad / "config.json") in text and field in text, (argv, text)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda m: m.pop("shards"), "shards is missing"),
        (lambda m: m.__setitem__("shards", "shard-00000.jsonl"), "shards: input should be a valid list"),
        (lambda m: m["shards"][0].__setitem__("bytes", {"n": 1}), "shards[0].bytes"),
        (lambda m: m.__setitem__("target", "tiny"), "target: input should be a valid dictionary"),
    ],
)
def test_a_data_manifest_of_the_wrong_shape_exits_2_in_cache_and_online_train(run_dir, capsys, edit, field):
    _edit_json(run_dir / "data" / "manifest.json", edit)
    assert main(["cache", "--data", str(run_dir / "data"), "--out", str(run_dir / "cache2")]) == 2
    text = err(capsys)
    assert str(run_dir / "data" / "manifest.json") in text and field in text, text
    assert main(["train", "--run", str(run_dir), "--online", *FAST, "--max-steps", "1"]) == 2
    assert field in err(capsys)


def _checkpoint(run_dir):
    assert main(["train", "--run", str(run_dir), *FAST, "--max-steps", "1", "--save-every", "1"]) == 0
    (run_dir / "train" / "manifest.json").unlink()
    return run_dir / "train" / "checkpoints" / "last"


def _rewrite_state(last, edit):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = last.resolve()
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    state = json.loads(meta["state"])
    tensors = edit(state, tensors) or tensors
    save_file(tensors, str(path), {**meta, "state": json.dumps(state)})


@pytest.mark.parametrize(
    "case, words",
    [
        ("no-lr-lambdas", "scheduler.lr_lambdas is missing"),
        ("step-a-string", "step: input should be a valid integer"),
        ("config-a-list", "config: input should be a valid dictionary"),
        ("tensor-of-another-shape", "the draft's is"),
    ],
)
def test_a_checkpoint_of_the_wrong_shape_is_named_on_resume(run_dir, capsys, case, words):
    import torch

    last = _checkpoint(run_dir)

    def edit(state, tensors):
        if case == "no-lr-lambdas":
            state["scheduler"].pop("lr_lambdas")
        elif case == "step-a-string":
            state["step"] = "one"
        elif case == "config-a-list":
            state["config"] = [1]
        else:
            name = state["model"]["fc.weight"]["$tensor"]
            tensors[name] = torch.zeros(3, 3)
        return tensors

    _rewrite_state(last, edit)
    assert main(["train", "--run", str(run_dir), *FAST, "--max-steps", "2", "--save-every", "1"]) == 2
    text = err(capsys)
    assert str(last.resolve()) in text and words in text, text


# ---------------------------------------------------------------- 3. files that are not regular files
def _fifo_in_place(path):
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)


def _no_hang(argv, seconds=60):
    """main(argv) with a watchdog: a FIFO read would block until a writer comes; the watchdog comes
    after `seconds` (so a hang fails the test instead of stalling the suite)."""
    import threading
    import time

    fifos = []
    stop = threading.Event()

    def watchdog():
        if stop.wait(seconds):
            return
        for f in fifos:
            try:
                fd = os.open(f, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass

    t0 = time.monotonic()
    th = threading.Thread(target=watchdog, daemon=True)
    th.start()
    try:
        return main(argv), time.monotonic() - t0, fifos
    finally:
        stop.set()


@pytest.mark.parametrize(
    "case", ["head-weights", "head-config", "data-manifest", "checkpoint", "tokenizer", "recipe", "engine-config"]
)
def test_a_fifo_where_eagle3_reads_a_file_exits_2_at_once(run_dir, tmp_path, head, tiny_target_dir, capsys, case):
    import shutil

    h = tmp_path / "h"
    shutil.copytree(head, h)
    target = tmp_path / "t"
    shutil.copytree(tiny_target_dir, target)
    if case == "head-weights":
        fifo, argv = h / "model.safetensors", ["eval", "--head", str(h), "--out", str(tmp_path / "ev")]
    elif case == "head-config":
        fifo, argv = h / "config.json", ["serve", "--head", str(h), "--target", str(tiny_target_dir), "--dry-run"]
    elif case == "data-manifest":
        fifo, argv = (
            run_dir / "data" / "manifest.json",
            ["cache", "--data", str(run_dir / "data"), "--out", str(tmp_path / "c")],
        )
    elif case == "checkpoint":
        fifo = _checkpoint(run_dir).resolve()
        argv = ["train", "--run", str(run_dir), *FAST, "--max-steps", "2", "--save-every", "1"]
    elif case == "tokenizer":
        fifo, argv = (
            target / "tokenizer.json",
            ["eval", "--head", str(head), "--target", str(target), "--out", str(tmp_path / "ev")],
        )
    elif case == "recipe":
        fifo, argv = (
            tmp_path / "recipe.yaml",
            ["train", "--run", str(run_dir), "--recipe", str(tmp_path / "recipe.yaml")],
        )
    else:
        fifo = tmp_path / "engine.yaml"
        argv = [
            "serve",
            "--head",
            str(head),
            "--target",
            str(tiny_target_dir),
            "--dry-run",
            "--",
            "--config",
            str(fifo),
        ]
    _fifo_in_place(fifo)
    code, seconds, _ = _no_hang(argv)
    text = err(capsys)
    assert code == 2 and seconds < 30, (code, seconds, text)
    assert str(fifo) in text or fifo.name in text, text


# ---------------------------------------------------------------- 5. bombs in every YAML reader
def _alias_bomb(path, depth=9):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, depth)]
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 1100
    return path


@pytest.mark.parametrize("reader", ["serve-config", "recipe", "augment"])
def test_a_yaml_alias_bomb_is_refused_by_every_yaml_reader(run_dir, tmp_path, head, tiny_target_dir, capsys, reader):
    import time

    bomb = _alias_bomb(tmp_path / "bomb.yaml")
    argv = {
        "serve-config": [
            "serve",
            "--head",
            str(head),
            "--target",
            str(tiny_target_dir),
            "--dry-run",
            "--",
            "--config",
            str(bomb),
        ],
        "recipe": ["train", "--run", str(run_dir), "--recipe", str(bomb)],
        "augment": [
            "gen-data",
            "--target",
            str(tiny_target_dir),
            "--input",
            "gsm8k:2",
            "--augment",
            str(bomb),
            "--out",
            str(tmp_path / "d"),
            "--dry-run",
        ],
    }[reader]
    t0 = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - t0 < 30
    assert "aliases" in err(capsys)


# ---------------------------------------------------------------- 6. a tokenizer that disagrees with its target
@pytest.mark.parametrize("ids", [[5000], [4096], [4096, 9999]])
def test_a_tokenizer_with_ids_past_the_targets_vocab_is_refused_when_the_target_is_opened(
    tmp_path, tiny_target_dir, head, capsys, ids
):
    import shutil

    target = tmp_path / "t"
    shutil.copytree(tiny_target_dir, target)
    tj = json.loads((target / "tokenizer.json").read_text())
    for i in ids:
        tj["added_tokens"].append(
            {
                "id": i,
                "content": f"<extra_{i}>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    (target / "tokenizer.json").write_text(json.dumps(tj))
    for argv in (
        ["gen-data", "--target", str(target), "--input", "gsm8k:2", "--out", str(tmp_path / "d")],
        ["eval", "--head", str(head), "--target", str(target), "--out", str(tmp_path / "ev"), "--num-prompts", "1"],
    ):
        assert main(argv) == 2
        text = err(capsys)
        assert "disagree" in text and str(target / "config.json") in text and str(ids[0]) in text, text


# ---------------------------------------------------------------- 7. options: ranges and options that need each other
@pytest.mark.parametrize(
    "argv, words",
    [
        (["gen-data", "--answers-per-prompt", "2"], "--answers-per-prompt 2 needs --answer-temperatures"),
        (["gen-data", "--answers-per-prompt", "100000", "--answer-temperatures", "0.7"], "at most 64"),
        (["gen-data", "--synth-turns", str(10**9)], "--synth-turns must be at most 64"),
        (["gen-data", "--synth-turns", "0"], "--synth-turns must be an integer >= 1"),
        (["eval", "--threads", "100000"], "--threads must be an integer from 1 to 1024"),
        (["eval", "--threads", "0"], "--threads must be an integer from 1 to 1024"),
    ],
)
def test_unbounded_or_incomplete_options_exit_2_before_anything_runs(
    tmp_path, tiny_target_dir, head, capsys, argv, words
):
    stage, *flags = argv
    base = {
        "gen-data": ["--target", str(tiny_target_dir), "--input", "gsm8k:2", "--out", str(tmp_path / "d")],
        "eval": ["--head", str(head), "--out", str(tmp_path / "ev")],
    }[stage]
    assert main([stage, *base, *flags]) == 2
    assert words in err(capsys)
    assert not (tmp_path / "d").exists() and not (tmp_path / "ev").exists()


@pytest.mark.parametrize(
    "arg",
    [
        "-hf",
        "--hf-repo",
        "-hff",
        "--hf-repo-draft",
        "-hfd",
        "--model-url",
        "-mu",
        "--lora",
        "--lora-scaled",
        "--control-vector",
        "--mmproj",
        "--override-kv",
        "--models-dir",
        "--docker-repo",
    ],
)
def test_the_llama_cpp_guard_refuses_flags_that_swap_the_model_or_draft_or_add_adapters(arg):
    from eagle3cli.serve.engine_args import check_engine_args

    def check_extra(extra):
        return check_engine_args("llama.cpp", extra)

    problems = check_extra([arg, "x"])
    assert [p.is_error for p in problems] == [True], arg
    assert any(w in problems[0].what for w in ("another target", "another draft", "adapters", "metadata"))
    assert check_extra([f"{arg}=x"]) and not check_extra(["--ctx-size", "4096", "--threads", "2"])


# ---------------------------------------------------------------- 4. numbers a server reports
ANSWER = "The answer is four."


def _usage_server(completion_tokens):
    from http.server import BaseHTTPRequestHandler

    from http_fixtures import ThreadedServer

    usage = {"prompt_tokens": 3} | ({} if completion_tokens == "missing" else {"completion_tokens": completion_tokens})
    body = json.dumps(
        {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
            "usage": usage,
        }
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, data):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(body)

        def do_GET(self):
            self._send(b'{"data": [{"id": "fixed"}]}' if self.path == "/v1/models" else b"{}")

        def log_message(self, *a):
            pass

    server = ThreadedServer()
    server.serve(Handler, daemon_threads=True)
    return server


@pytest.mark.parametrize("reported", [10**9, -40, 3.5, "n/a", "missing", 9])
def test_serve_bench_checks_the_servers_token_counts(tmp_path, tiny_target_dir, capsys, reported):
    """A count that is not an integer from 0 to max_tokens is recounted with the target's tokenizer
    (the table and bench.json say how many), or, without --target, refused: never the measurement."""
    from eagle3cli.model.target import open_target

    truth = len(open_target(tiny_target_dir).tokenizer(ANSWER, add_special_tokens=False).input_ids)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["a"]}\n{"turns": ["b"]}\n')
    server = _usage_server(reported)
    try:
        base = [
            "serve-bench",
            "--spec-url",
            server.url,
            "--api",
            "openai",
            "--prompts",
            str(prompts),
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--max-tokens",
            "8",
        ]
        assert main([*base, "--target", str(tiny_target_dir), "--out", str(tmp_path / "b")]) == 0
        text = err(capsys)
        (level,) = json.loads((tmp_path / "b" / "bench.json").read_text())["levels"]
        assert level["recounted"] == 2 and level["output_tokens"] == 2 * truth, level
        said = "reported no completion tokens" if reported == "missing" else f"reported {reported!r}"[:18]
        assert "counted again" in text and said in text, text
        assert level["throughput_tok_s"] < 1e6
        assert main([*base, "--out", str(tmp_path / "c")]) == 0
        (level,) = json.loads((tmp_path / "c" / "bench.json").read_text())["levels"]
        assert level["failed"] == 2 and level["output_tokens"] == 0 and "--target" in level["first_error"]
        err(capsys)
    finally:
        server.stop()


def test_serve_bench_keeps_a_count_in_range(tmp_path, tiny_target_dir, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["a"]}\n')
    server = _usage_server(5)
    try:
        assert (
            main(
                [
                    "serve-bench",
                    "--spec-url",
                    server.url,
                    "--api",
                    "openai",
                    "--prompts",
                    str(prompts),
                    "--concurrency",
                    "1",
                    "--requests",
                    "2",
                    "--max-tokens",
                    "8",
                    "--out",
                    str(tmp_path / "b"),
                ]
            )
            == 0
        )
        (level,) = json.loads((tmp_path / "b" / "bench.json").read_text())["levels"]
        assert level["recounted"] == 0 and level["output_tokens"] == 10 and level["failed"] == 0
        err(capsys)
    finally:
        server.stop()


@pytest.mark.parametrize("reported", [10**9, -40, 2.5, "n/a"])
def test_gen_data_recounts_a_servers_token_counts_and_says_so(tmp_path, tiny_target_dir, capsys, reported):
    from eagle3cli.model.target import open_target

    truth = len(open_target(tiny_target_dir).tokenizer(ANSWER, add_special_tokens=False).input_ids)
    server = _usage_server(reported)
    try:
        out, rows = tmp_path / "d", tmp_path / "rows.jsonl"
        rows.write_text(
            "".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(3))
        )
        argv = [
            "gen-data",
            "--target",
            str(tiny_target_dir),
            "--input",
            str(rows),
            "--backend",
            "openai",
            "--endpoint",
            server.url,
            "--max-new-tokens",
            "64",
            "--out",
            str(out),
        ]
        assert main(argv) == 0
        err(capsys)
    finally:
        server.stop()
    tokens = json.loads((out / "manifest.json").read_text())["tokens"]
    assert tokens["completion"] == 3 * truth and tokens["completion_recounted"] == 3, tokens


def _sglang_server(reported, output_ids):
    from http.server import BaseHTTPRequestHandler

    from http_fixtures import ThreadedServer

    class Handler(BaseHTTPRequestHandler):
        def _send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            meta = {"completion_tokens": reported, "spec_verify_ct": 3, "spec_accept_length": 4.0}
            self._send({"text": "x", "meta_info": meta} | ({"output_ids": output_ids} if output_ids else {}))

        def log_message(self, *a):
            pass

    server = ThreadedServer()
    server.serve(Handler, daemon_threads=True)
    return server


@pytest.mark.parametrize("reported, ids, code", [(10**9, 12, 0), (-40, 12, 0), (7.5, 12, 0), (10**9, 0, 2), (9, 0, 0)])
def test_eval_endpoint_checks_the_servers_token_counts(tmp_path, tiny_target_dir, capsys, reported, ids, code):
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"turns": ["What is two plus two?"]}\n')
    server = _sglang_server(reported, list(range(ids)))
    try:
        rc = main(
            [
                "eval",
                "--endpoint",
                server.url,
                "--target",
                str(tiny_target_dir),
                "--bench",
                str(bench),
                "--num-prompts",
                "1",
                "--max-new-tokens",
                "16",
                "--out",
                str(tmp_path / "ep"),
            ]
        )
    finally:
        server.stop()
    text = err(capsys)
    assert rc == code, text
    if code == 2:
        assert "completion tokens" in text and "no token ids" in text
        return
    rep = json.loads((tmp_path / "ep" / "report.json").read_text())
    expected = reported if reported == 9 else ids
    assert rep["tokens"] == expected and rep["tokens_recounted"] == (0 if reported == 9 else 1)
    assert rep["tau"] == pytest.approx(expected / 3)


@pytest.mark.parametrize(
    "recommended, field",
    [
        ({"steps": 6}, "recommended.topk is missing"),
        ({"steps": "6", "topk": 1, "num_draft_tokens": 7}, "recommended.steps"),
        ({"steps": [6], "topk": 1, "num_draft_tokens": 7}, "recommended.steps"),
        ({"steps": 10**9, "topk": 1, "num_draft_tokens": 7}, "recommended.steps"),
        ("fast", "recommended"),
    ],
)
def test_an_eval_report_of_the_wrong_shape_is_named_by_serve(
    tmp_path, head, tiny_target_dir, capsys, recommended, field
):
    ev = tmp_path / "eval"
    ev.mkdir()
    (ev / "report.json").write_text(json.dumps({"recommended": recommended}))
    argv = ["serve", "--head", str(head), "--target", str(tiny_target_dir), "--from-eval", str(ev), "--dry-run"]
    assert main(argv) == 2
    text = err(capsys)
    assert str(ev / "report.json") in text and field in text, text


@pytest.mark.parametrize(
    "folder, edit",
    [
        ("head", lambda m: m.__setitem__("shards", "model.safetensors")),
        ("head", lambda m: m["shards"][0].__setitem__("sha256", ["x"])),
        ("train", lambda m: m.__setitem__("steps", "2")),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_written_again_by_a_rerun(run_dir, capsys, folder, edit):
    """A finished train's head or train manifest edited by hand: the rerun exports the head and writes
    the manifest again (was: a TypeError walking `shards`)."""
    args = ["train", "--run", str(run_dir), *FAST, "--max-steps", "2", "--save-every", "2"]
    assert main(args) == 0
    _edit_json(run_dir / folder / "manifest.json", edit)
    assert main(args) == 0
    head, train = (json.loads((run_dir / f / "manifest.json").read_text()) for f in ("head", "train"))
    assert isinstance(head["shards"], list) and isinstance(head["shards"][0]["sha256"], str) and train["steps"] == 2
    err(capsys)
