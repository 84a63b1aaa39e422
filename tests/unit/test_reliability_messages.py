"""Issue 24, weak cases: a clear message (exit 2) instead of a traceback or a wrong hint, and late
failures that no longer cost the results already computed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from cli_helpers import err, wide_console  # noqa: F401  (wide_console: autouse here)
from head_fixtures import make_head
from train_fixtures import REPO

from eagle3cli.cli import main


# ---------------------------------------------------------------- recipes
def dry_run(tiny_target_dir, recipe) -> list[str]:
    return ["gen-data", "--recipe", str(recipe), "--target", str(tiny_target_dir), "--input", "gsm8k", "--dry-run"]


def test_a_key_given_twice_in_a_recipe_is_refused(tmp_path, tiny_target_dir, capsys):
    r = tmp_path / "r.yaml"
    r.write_text("gen_data:\n  seed: 1\n  max_new_tokens: 8\n  seed: 2\n")
    assert main(dry_run(tiny_target_dir, r)) == 2
    assert "key 'seed' is given twice (line 2 and line 4)" in err(capsys)
    r.write_text("gen_data:\n  seed: 1\ncache:\n  max_length: 64\n")  # one key per section is fine
    assert main(dry_run(tiny_target_dir, r)) == 0
    capsys.readouterr()


@pytest.mark.parametrize("kind", ["binary", "utf-16", "folder"])
def test_a_recipe_that_is_not_yaml_text_is_named(tmp_path, tiny_target_dir, capsys, kind):
    r = tmp_path / "r.yaml"
    if kind == "binary":
        r.write_bytes(bytes(range(256)) * 4)
    elif kind == "utf-16":
        r.write_text("gen_data:\n  seed: 1\n", encoding="utf-16")
    else:
        r.mkdir()
    assert main(dry_run(tiny_target_dir, r)) == 2
    text = err(capsys)
    assert ("is a folder" in text) if kind == "folder" else ("is not UTF-8 text" in text)
    assert "in the way" not in text  # not the run-folder message


# ---------------------------------------------------------------- the stand-in server
def test_the_stand_in_server_on_a_port_in_use_exits_2_before_loading_the_model(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        # a model folder that does not exist: the port is checked first, so this never gets to load it
        cmd = [sys.executable, "-m", "eagle3cli.data.http_server", "--model", str(tmp_path / "nothing")]
        r = subprocess.run([*cmd, "--port", str(port)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr and "--port" in r.stderr


# ---------------------------------------------------------------- eval writes its report first
@pytest.mark.parametrize("failure", ["blocked-png", "no-matplotlib"])
def test_eval_keeps_its_report_when_the_plot_fails(tmp_path, tiny_target_dir, capsys, monkeypatch, failure):
    head = make_head(tiny_target_dir, tmp_path / "head")
    out = tmp_path / "eval"
    if failure == "blocked-png":
        (out / "acceptance.png").mkdir(parents=True)  # something in the way of the plot
    else:  # matplotlib failing to import (as under a memory limit) after decoding finished
        monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    args = ["eval", "--head", str(head), "--target", str(tiny_target_dir), "--out", str(out)]
    assert main([*args, "--num-prompts", "1", "--max-new-tokens", "4", "--depth", "2"]) == 0
    text = err(capsys)
    assert "no plot at" in text and "the numbers are in the JSON report" in text
    report = json.loads((out / "report.json").read_text())
    assert report["num_prompts"] == 1 and report["heads"]
    assert json.loads((out / "manifest.json").read_text())["files"] == ["report.json"]


# ---------------------------------------------------------------- inputs: say what was found
@pytest.mark.parametrize(
    "kind, needle",
    [
        ("utf-16", "UTF-16 text, not UTF-8"),
        ("gzip-no-suffix", "gzip-compressed data in a file whose name does not end in .gz"),
        ("pretty-printed", "JSON objects spread over several lines (pretty-printed)"),
        ("empty", "found an empty file"),
    ],
)
def test_an_unreadable_input_says_what_it_holds(tmp_path, kind, needle):
    import gzip

    from eagle3cli.data.formats import parse_input_spec, read_input
    from eagle3cli.errors import UsageError

    rows = [{"prompt": "one"}, {"prompt": "two"}]
    p = tmp_path / "in.jsonl"
    if kind == "utf-16":
        p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-16")
    elif kind == "gzip-no-suffix":
        p.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    elif kind == "pretty-printed":
        p.write_text("".join(json.dumps(r, indent=2) + "\n" for r in rows))
    else:
        p.write_text("")
    with pytest.raises(UsageError) as e:
        read_input(parse_input_spec(str(p)))
    assert needle in e.value.what and "no JSON rows" not in e.value.what


def test_eval_and_serve_bench_name_their_own_flag_for_an_unreadable_bench(tmp_path, tiny_target_dir, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    head = make_head(tiny_target_dir, tmp_path / "head")
    assert main(["eval", "--head", str(head), "--target", str(tiny_target_dir), "--bench", str(empty)]) == 2
    text = err(capsys)
    assert f"--bench {empty}" in text and "--input" not in text
    args = ["serve-bench", "--spec-url", "http://127.0.0.1:9", "--api", "openai", "--prompts", str(empty)]
    assert main([*args, "--out", str(tmp_path / "bench")]) == 2
    text = err(capsys)
    assert f"--prompts {empty}" in text and "--input" not in text and "--bench" not in text


def test_gen_data_inputs_that_would_collide_or_be_overwritten_are_refused(tmp_path, tiny_target_dir, capsys):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "train.jsonl").write_text(json.dumps({"prompt": f"from {d}"}) + "\n")
    args = ["gen-data", "--target", str(tiny_target_dir), "--no-regenerate"]
    two = ["--input", str(tmp_path / "a" / "train.jsonl"), "--input", str(tmp_path / "b" / "train.jsonl")]
    assert main([*args, *two, "--out", str(tmp_path / "out")]) == 2
    assert "2 inputs are named 'train'" in err(capsys)
    # an input inside the output folder: refused, and no advice to delete that folder
    src = tmp_path / "a" / "train.jsonl"
    assert main([*args, "--input", str(src), "--out", str(tmp_path / "a")]) == 2
    text = err(capsys)
    assert "holds this run's input" in text and "delete" not in text
    assert src.exists()
    # a folder holding someone else's files: named, and not advised for deletion either
    assert main([*args, "--input", str(src), "--out", str(tmp_path / "b")]) == 2
    text = err(capsys)
    assert "it holds train.jsonl" in text and "delete" not in text


@pytest.mark.slow  # a gen-data process of its own (bash process substitution): ~6 s of imports and a target
def test_gen_data_records_the_hash_of_the_bytes_it_read_from_a_pipe(tmp_path, tiny_target_dir, capsys):
    import hashlib

    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
            + "\n"
            for i in range(3)
        )
    )
    out = tmp_path / "data"
    script = (
        "import sys; from eagle3cli.cli import main; "
        f"sys.exit(main(['gen-data', '--target', {str(tiny_target_dir)!r}, '--no-regenerate', "
        f"'--input', sys.argv[1], '--out', {str(out)!r}]))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        ["bash", "-c", f'"$0" -c "$1" <(cat {src})', sys.executable, script], env=env, capture_output=True
    )
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["inputs"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert m["inputs"][0]["sha256"] != hashlib.sha256(b"").hexdigest()


# ---------------------------------------------------------------- our limits are not the endpoint's fault
EMFILE = """
import json, os, resource, sys
from http_fixtures import FixedAnswerServer
from eagle3cli.cli import main
from eagle3cli.model.target import load_tokenizer
target, src, out = sys.argv[1:4]
srv = FixedAnswerServer("fine")
load_tokenizer(target)  # (files it opens later are closed again; connections stay open)
n = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 12, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
sys.exit(main(["gen-data", "--target", target, "--input", src, "--out", out, "--backend", "openai",
               "--endpoint", srv.url, "--concurrency", "32", "--max-new-tokens", "2", "--retries", "0"]))
"""


@pytest.mark.slow  # a gen-data process of its own under `ulimit -n`: ~6 s of imports and a target
def test_running_out_of_file_descriptors_is_not_blamed_on_the_endpoint(tmp_path, tiny_target_dir):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"q {i}"}) + "\n" for i in range(40)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "COLUMNS": "1000"}
    cmd = [sys.executable, "-c", EMFILE, str(tiny_target_dir), str(src), str(tmp_path / "out")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    text = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and "Traceback" not in text, text[-2000:]
    assert "too many open files" in text and "ulimit -n" in text and "pending" not in text


def test_gen_data_rerun_on_a_damaged_manifest_says_so(tmp_path, tiny_target_dir, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}))
    out = tmp_path / "data"
    args = ["gen-data", "--target", str(tiny_target_dir), "--no-regenerate", "--input", str(src), "--out", str(out)]
    assert main(args) == 0
    (out / "manifest.json").write_text('{"stage": "gen-data", "schema')  # cut short
    assert main(args) == 2
    assert "or a damaged one" in err(capsys)


def test_a_target_changed_in_place_is_not_answered_with_pass_the_same_target(tmp_path, tiny_target_dir, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    target = tmp_path / "target"
    shutil.copytree(tiny_target_dir, target)
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "hi"}\n{"prompt": "there"}\n')
    run = tmp_path / "run"
    gen = ["gen-data", "--target", str(target), "--input", str(src), "--run", str(run), "--max-new-tokens", "2"]
    assert main(gen) == 0
    (weights,) = target.glob("*.safetensors")
    t = load_file(str(weights))
    t["lm_head.weight"] = t["lm_head.weight"] * 1.05  # retrained in place
    save_file(t, str(weights), metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["cache", "--run", str(run), "--max-length", "64", "--draft-vocab-size", "64"]) == 2
    text = err(capsys)
    assert f"the target at {target} changed since the data was generated" in text
    assert f"--input {src} --run runs/NEW" in text and "(--target)" not in text
