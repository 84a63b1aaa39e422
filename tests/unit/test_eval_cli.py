"""`eagle3 eval` end to end on a tiny random target + head: the files it writes, the report's
fields, bad inputs exiting 2, and the --endpoint path against a fake SGLang /generate."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import torch
from cli_helpers import eval_args
from head_fixtures import make_head

from eagle3cli.cli import main


@pytest.fixture(scope="module")
def heads(tiny_target_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-heads")
    return make_head(tiny_target_dir, root / "run" / "head"), make_head(tiny_target_dir, root / "other" / "head", 1)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("eval-prompts") / "prompts.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "What is two plus two?"}]},
        {"messages": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_eval_writes_report_plot_manifest(tiny_target_dir, heads, prompts_file, tmp_path):
    head, other = heads
    out = tmp_path / "eval"
    prompts = ("--bench", str(prompts_file), "--num-prompts", "3", "--max-new-tokens", "10")
    tree = ("--depth", "3", "--mode", "both", "--topk", "2", "--num-draft-tokens", "6")
    rc = main(eval_args(tiny_target_dir, head, out, "--compare", str(other), *prompts, *tree))
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"report.json", "acceptance.png", "manifest.json"}
    rep = json.loads((out / "report.json").read_text())
    assert len(rep["heads"]) == 2
    for modes in rep["heads"].values():
        assert set(modes) == {"head", "chain", "tree"} and modes["head"]["layout"] == "eagle3"
        for mode in ("chain", "tree"):
            st = modes[mode]
            assert st["lossless"]["compared"] == 3 and st["lossless"]["mismatches"] == 0
            acc = st["acceptance"]
            assert len(acc["per_depth"]) == 3 and acc["tau"] >= 1.0
            assert acc["alpha_definition"].startswith(f"{mode}:")
            lo, hi = st["speedup_interval"]
            assert lo <= st["speedup_vs_plain"] <= hi
            assert [p["prompt"] for p in st["per_prompt"]] == ["prompts:0", "prompts:1", "prompts:2"]
        chain, tree = modes["chain"]["acceptance"], modes["tree"]["acceptance"]
        # tau(d) for d < D only from a chain, and only labelled as an estimate; never for a tree
        assert len(chain["tau_by_depth_estimate"]) == 4 and "ESTIMATE" in chain["tau_by_depth_note"]
        assert chain["tau_by_depth_estimate"][3] == pytest.approx(chain["tau"])
        assert "tau_by_depth_estimate" not in tree and "tau_by_depth" not in tree
        assert chain["per_depth"][0]["attempts"] == chain["rounds"]
    assert rep["baselines"]["plain"]["tokens"] == 30 and rep["baselines"]["generate"]["tokens"] == 30
    rec = rep["recommended"]
    assert set(rec) >= {"steps", "topk", "num_draft_tokens", "speedup", "speedup_interval", "tied", "notes"}
    # the note that nothing beats plain decoding reaches the report exactly when the best measured
    # configuration's interval stays below plain speed (for a random head it usually does, but
    # whether it does is timing, which a test must not assume)
    main_head = next(iter(rep["heads"].values()))
    best = main_head[rec["best_measured"].split()[0]]
    slower = best["speedup_interval"][1] < 1.0
    assert slower == any("no configuration beats plain decoding" in n for n in rec["notes"])
    cmp = rep["comparison"]["modes"]["chain"]
    assert [r["head"] for r in cmp] == list(rep["heads"]) and "verdict" in cmp[1]
    assert "bonus" in rep["tau_definition"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["stage"] == "eval" and man["counts"]["prompts"] == 3
    assert all(Path(h["path"]).is_absolute() for h in man["heads"])
    assert (out / "acceptance.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--depth", "0"], "--depth must be an integer >= 1"),
        (["--bench", "nonsense"], "nonsense is neither a named source nor an existing file"),
        (["--mode", "spiral"], "'spiral' is not one of"),
        (["--dtype", "fp8"], "'fp8' is not one of"),
        (["--max-new-tokens", "5000"], "positions, the target has 1024"),
    ],
)
def test_bad_inputs_exit_2(tiny_target_dir, heads, args, needle, capsys, tmp_path):
    rc = main(eval_args(tiny_target_dir, heads[0], tmp_path / "e", "--num-prompts", "1", *args))
    assert rc == 2
    assert needle in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("kernels, head_dtype", [("onednn", torch.bfloat16), ("torch", torch.float32)])
def test_bf16_target_head_dtype_follows_the_cpu_kernels(
    tiny_target_dir, heads, prompts_file, tmp_path, monkeypatch, kernels, head_dtype
):
    """--dtype bf16: the target runs in bf16; the head takes bf16 too with oneDNN-packed kernels
    (their bf16 one-row matmuls are the fast ones) and stays fp32 with plain F.linear; decoding
    works, and the manifest and report record the choices."""
    import eagle3cli.eval.run as run_module
    from eagle3cli.model.cpu_kernels import onednn_cannot_run

    if kernels == "onednn" and onednn_cannot_run(torch.bfloat16):  # a build or CPU without it
        pytest.skip(onednn_cannot_run(torch.bfloat16))
    seen = []

    class Recording(run_module.SpeculativeDecoder):
        def __init__(self, target, draft, *args, **kwargs):
            seen.append((target.dtype, draft.fc.weight.dtype))
            super().__init__(target, draft, *args, **kwargs)

    monkeypatch.setattr(run_module, "SpeculativeDecoder", Recording)
    out = tmp_path / "eval"
    args = ["--bench", str(prompts_file), "--num-prompts", "1", "--max-new-tokens", "8", "--depth", "2"]
    assert main(eval_args(tiny_target_dir, heads[0], out, *args, "--dtype", "bf16", "--cpu-kernels", kernels)) == 0
    assert seen and set(seen) == {(torch.bfloat16, head_dtype)}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["dtype"] == "bf16" and manifest["config"]["cpu_kernels"] == kernels
    rep = json.loads((out / "report.json").read_text())
    assert rep["kernels"].startswith(kernels)
    (stats,) = [h["chain"] for h in rep["heads"].values()]
    assert stats["acceptance"]["tau"] >= 1.0


def test_head_for_another_target_exits_2(deep_target_dir, tiny_target_dir, tmp_path, capsys):
    head = make_head(deep_target_dir, tmp_path / "deep-head")  # aux layers [2, 4, 5] of an 8-layer target
    rc = main(eval_args(tiny_target_dir, head, tmp_path / "e", "--num-prompts", "1"))
    assert rc == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "aux layers hidden_states[2, 4, 5]" in err and "a 4-layer target does not have" in err


def test_missing_head_exits_2(tiny_target_dir, tmp_path, capsys):
    rc = main(["eval", "--target", str(tiny_target_dir), "--head", str(tmp_path / "nope")])
    assert rc == 2 and "does not exist" in " ".join(capsys.readouterr().err.split())


class _FakeSGLang(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/generate" and "text" not in body
        _FakeSGLang.bodies.append(body)
        n = body["sampling_params"]["max_new_tokens"]
        meta = {"completion_tokens": n, "spec_verify_ct": n // 4, "spec_accept_length": 4.0}
        data = json.dumps({"text": "x", "meta_info": meta}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def test_endpoint_reads_sglang_meta_info(tiny_target_dir, prompts_file, tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _FakeSGLang)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        rc = main(
            [
                "eval",
                "--endpoint",
                f"http://127.0.0.1:{server.server_port}",
                "--target",
                str(tiny_target_dir),
                "--bench",
                str(prompts_file),
                "--num-prompts",
                "2",
                "--max-new-tokens",
                "40",
                "--out",
                str(tmp_path / "ep"),
            ]
        )
    finally:
        server.shutdown()
    assert rc == 0
    rep = json.loads((tmp_path / "ep" / "report.json").read_text())
    assert rep["tau"] == pytest.approx(4.0) and rep["num_prompts"] == 2
    from eagle3cli.model.target import load_tokenizer

    text = load_tokenizer(tiny_target_dir).decode(_FakeSGLang.bodies[0]["input_ids"])
    assert "<|im_start|>user\nWhat is two plus two?<|im_end|>" in text  # templated, as the head was trained
    assert text.endswith("<|im_start|>assistant\n")


def test_endpoint_unreachable_exits_2(tiny_target_dir, prompts_file, tmp_path, capsys):
    rc = main(
        [
            "eval",
            "--endpoint",
            "http://127.0.0.1:9",
            "--target",
            str(tiny_target_dir),
            "--bench",
            str(prompts_file),
            "--num-prompts",
            "1",
            "--out",
            str(tmp_path / "ep"),
        ]
    )
    assert rc == 2 and "cannot reach" in " ".join(capsys.readouterr().err.split())


def test_max_prompt_tokens_skips_long_prompts_and_takes_the_next(tiny_target_dir, heads, tmp_path, capsys):
    """A bench with prompts past the context (held-out ShareGPT has 20k-token ones) is not refused
    whole: --max-prompt-tokens skips them, takes the next prompts, and the report lists the skipped."""
    p = tmp_path / "mixed.jsonl"
    long = "count the apples again " * 400  # past the tiny target's 1,024 positions
    rows = ["Hi", long, "Name a fruit.", "What is two plus two?"]
    p.write_text("".join(json.dumps({"messages": [{"role": "user", "content": r}]}) + "\n" for r in rows))
    base = ["eval", "--target", str(tiny_target_dir), "--head", str(heads[0]), "--bench", str(p)]
    base += ["--num-prompts", "3", "--max-new-tokens", "4", "--depth", "2", "--no-generate-baseline"]
    assert main([*base, "--out", str(tmp_path / "refused")]) == 2
    assert "--max-prompt-tokens" in " ".join(capsys.readouterr().err.split())
    out = tmp_path / "eval"
    assert main([*base, "--max-prompt-tokens", "200", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["num_prompts"] == 3 and [s["id"] for s in rep["skipped_long_prompts"]] == ["mixed:1"]
    assert rep["skipped_long_prompts"][0]["tokens"] > 200
    assert "skipped 1 longer prompt" in " ".join(capsys.readouterr().err.split())
