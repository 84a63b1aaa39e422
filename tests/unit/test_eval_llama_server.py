"""`eagle3 eval --endpoint` against llama-server, on a stand-in that speaks its API over real HTTP:
`/props` (found as llama.cpp), `/completion` with `timings.draft_n`/`draft_n_accepted`, and the
`llamacpp:spec_decode_*` counters on `/metrics` that give the verification steps."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest
from cli_helpers import err, wide_console  # noqa: F401 — autouse fixture
from http_fixtures import ThreadedServer

from eagle3cli.cli import main
from eagle3cli.eval.llama_server import counters


class FakeLlamaServer(ThreadedServer):
    """Answers every prompt with `tokens`; each request drafts `steps` rounds of K=3, accepting `accepted`."""

    def __init__(self, tokens: list[int], steps: int = 0, accepted: int = 0):
        state = {"steps": 0.0, "drafted": 0.0, "accepted": 0.0, "pos0": 0.0}
        self.bodies: list[dict] = []
        self.arrivals: list[float] = []  # when each /completion came
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            arrivals = self.arrivals

            def _send(self, code: int, data: bytes, ctype: str = "application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/props":
                    self._send(200, json.dumps({"build_info": "b1-x", "default_generation_settings": {}}).encode())
                elif self.path == "/metrics":
                    lines = [
                        f"llamacpp:spec_decode_num_drafts_total {state['steps']}",
                        f"llamacpp:spec_decode_num_draft_tokens_total {state['drafted']}",
                        f"llamacpp:spec_decode_num_accepted_tokens_total {state['accepted']}",
                        f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {state["pos0"]}',
                    ]
                    self._send(200, "\n".join(lines).encode(), "text/plain")
                else:
                    self._send(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                bodies.append(body)
                self.arrivals.append(time.monotonic())
                timings = {"predicted_n": len(tokens), "predicted_ms": 100.0}
                if steps:
                    timings.update(draft_n=3 * steps, draft_n_accepted=accepted)
                    state["steps"] += steps
                    state["drafted"] += 3 * steps
                    state["accepted"] += accepted
                    state["pos0"] += min(accepted, steps)
                self._send(200, json.dumps({"tokens": tokens, "timings": timings, "stop_type": "limit"}).encode())

            def log_message(self, *a):
                pass

        self.serve(Handler)


@pytest.fixture
def servers():
    started = []

    def start(*a, **kw) -> FakeLlamaServer:
        s = FakeLlamaServer(*a, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def _eval(tmp_path, spec, base=None) -> dict:
    args = ["eval", "--endpoint", spec.url, "--target", "models/tiny-target", "--bench", "mt_bench"]
    args += ["--num-prompts", "3", "--max-new-tokens", "8", "--out", str(tmp_path / "eval")]
    if base is not None:
        args += ["--base-endpoint", base.url]
    assert main(args) == 0
    return json.loads((tmp_path / "eval" / "report.json").read_text())


def test_tau_and_acceptance_from_timings_and_metrics(servers, tmp_path, capsys):
    spec = servers([5, 6, 7, 8], steps=2, accepted=3)
    report = _eval(tmp_path, spec)
    assert report["engine"] == "llama.cpp"
    assert report["draft_n"] == 18 and report["draft_n_accepted"] == 9  # 3 prompts x (6 drafted, 3 accepted)
    assert report["tau"] == pytest.approx(1 + 9 / 6)  # 1 + accepted / verification steps
    assert report["per_position"] == pytest.approx([1.0])
    assert [r["draft_n_accepted"] for r in report["per_prompt"]] == [3, 3, 3]
    body = spec.bodies[0]
    assert isinstance(body["prompt"], list) and all(isinstance(t, int) for t in body["prompt"])  # token ids
    assert body["top_k"] == 0 and body["min_p"] == 0 and body["return_tokens"] and not body["cache_prompt"]


def test_base_endpoint_compares_outputs_and_speed(servers, tmp_path, capsys):
    spec = servers([5, 6, 7, 8], steps=2, accepted=3)
    base = servers([5, 6, 9, 8])
    report = _eval(tmp_path, spec, base)
    b = report["baseline"]
    assert b["outputs_differ"] == 3 and b["first_difference"] == [2, 2, 2]
    assert b["speedup"] is not None
    assert "differ from plain" in err(capsys)
    # interleaved: prompt k on both servers before prompt k+1, the first of the two alternating
    times = sorted([(t, "spec") for t in spec.arrivals] + [(t, "plain") for t in base.arrivals])
    assert [who for _, who in times] == ["spec", "plain", "plain", "spec", "spec", "plain"]
    assert b["speedup_interval"][0] <= b["speedup"] <= b["speedup_interval"][1]


def test_no_draft_is_said(servers, tmp_path, capsys):
    report = _eval(tmp_path, servers([1, 2]))
    assert report["draft_n"] == 0 and report["tau"] is None
    assert "drafted nothing" in err(capsys)


def test_counters_parse_llama_server_metrics():
    text = 'llamacpp:spec_decode_num_drafts_total 4\nllamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2\n'
    assert counters(text) == {"num_drafts_total": 4.0, "num_accepted_tokens_per_pos_total[1]": 2.0}
    assert counters("llamacpp:prompt_tokens_total 3\n") is None
