"""A small OpenAI-compatible server backed by a transformers model (stdlib http.server).

Endpoints: `POST /v1/completions` (a raw prompt: how gen-data asks a target to write a user turn),
`POST /v1/chat/completions` (the model's chat template is applied here, server
side, as SGLang and vLLM do), `POST /generate` (SGLang's native shape: `text` + `meta_info`),
`GET /v1/models`, `GET /health`. Generation is serialised by a lock (one model, CPU-sized).
For tests it can inject faults: fail the first N requests with HTTP 500, answer the next B with
a malformed 200 (no `choices`), or make the next M sleep past the client's timeout.

    python -m eagle3cli.data.http_server --model models/tiny-target --port 30000
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from ..model.chat import TemplateRefusal
from .hf import HFBackend, encode_prompt
from .regen import Sampling


class ModelServer:
    def __init__(
        self,
        model,
        tokenizer,
        served_model_name: str = "default",
        fail_first: int = 0,
        sleep_first: int = 0,
        sleep_s: float = 0.0,
        max_new_tokens: int = 256,
        bad_first: int = 0,
    ):
        self.backend = HFBackend(model, tokenizer, Sampling(max_new_tokens=max_new_tokens), batch_size=1)
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.fail_first, self.sleep_first, self.sleep_s = fail_first, sleep_first, sleep_s
        self.bad_first = bad_first
        self.requests: list[dict] = []  # every POST body, in arrival order (tests inspect prompts)
        self._lock = threading.Lock()  # generation
        self._count_lock = threading.Lock()
        self._posts = 0
        self.in_flight = self.max_in_flight = 0  # generation requests being answered (tests read the peak)
        self.httpd: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------ faults
    def _fault(self) -> str | None:
        with self._count_lock:
            n = self._posts
            self._posts += 1
        if n < self.fail_first:
            return "fail"
        if n < self.fail_first + self.bad_first:
            return "bad"
        if n < self.fail_first + self.bad_first + self.sleep_first:
            return "sleep"
        return None

    # ------------------------------------------------------------ generation
    def _sampling(self, body: dict, max_key: str) -> Sampling:
        return Sampling(
            max_new_tokens=int(
                body.get(max_key) or body.get("max_completion_tokens") or self.backend.sampling.max_new_tokens
            ),
            temperature=float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0),
            top_p=float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0),
            seed=int(body.get("seed") or 0),
        )

    def _run(self, prompt_ids: list[int], sampling: Sampling):
        with self._lock:
            return self.backend.generate([prompt_ids], [sampling.seed], sampling=sampling)[0]

    def chat(self, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        s = self._sampling(body, "max_tokens")
        prompt = encode_prompt(self.tokenizer, messages, body.get("tools"), body.get("chat_template_kwargs"))
        out = self._run(prompt, s)
        message = {"role": "assistant", "content": out.text}
        if out.reasoning:  # as a server with a reasoning parser answers
            message["reasoning_content"] = out.reasoning
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": out.finish_reason}],
            "usage": {
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                "total_tokens": out.prompt_tokens + out.completion_tokens,
            },
        }

    def complete(self, body: dict) -> dict:
        """`/v1/completions`: the prompt as given (text, or token ids as vLLM takes them), no template."""
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            ids = list(prompt)
        else:
            raise ValueError("prompt must be a string or a non-empty list of token ids")
        out = self._run(ids, self._sampling(body, "max_tokens"))
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:12]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason}],
            "usage": {
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                "total_tokens": out.prompt_tokens + out.completion_tokens,
            },
        }

    def generate(self, body: dict) -> dict:
        params = body.get("sampling_params") or {}
        if "input_ids" in body:
            ids = [int(i) for i in body["input_ids"]]
        elif isinstance(body.get("text"), str):
            ids = self.tokenizer(body["text"], add_special_tokens=False).input_ids
        else:
            raise ValueError("give text (str) or input_ids (list of ints)")
        s = self._sampling(params, "max_new_tokens")
        out = self._run(ids, s)
        fr = {"type": out.finish_reason}
        if out.finish_reason == "length":
            fr["length"] = out.completion_tokens
        return {
            "text": out.text,
            "meta_info": {
                "id": uuid.uuid4().hex[:12],
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                "finish_reason": fr,
            },
        }

    # ------------------------------------------------------------ http
    def handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30  # an idle keep-alive connection is closed after this (stop() joins handlers)

            def log_message(self, *args):  # quiet: the client reports progress
                pass

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def do_GET(self):
                route = urlsplit(self.path).path.rstrip("/")  # a query string (?api_key=...) is not the route
                if route == "/health":
                    self._send(200, {"status": "ok"})
                elif route == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.served_model_name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError as e:
                    return self._send(400, {"error": {"message": f"invalid JSON: {e}"}})
                route = urlsplit(self.path).path.rstrip("/")
                if route not in ("/v1/chat/completions", "/v1/completions", "/generate"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                server.requests.append({"path": route, "body": body})
                with server._count_lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(route, body)
                finally:
                    with server._count_lock:
                        server.in_flight -= 1

            def _answer(self, route: str, body: dict) -> None:
                fault = server._fault()
                if fault == "fail":
                    return self._send(500, {"error": {"message": "injected failure"}})
                if fault == "bad":
                    return self._send(200, {"object": "error", "message": "injected malformed answer"})
                if fault == "sleep":
                    time.sleep(server.sleep_s)
                try:
                    answer = {"/v1/chat/completions": server.chat, "/v1/completions": server.complete}
                    result = answer.get(route, server.generate)(body)
                except (ValueError, TypeError, KeyError) as e:
                    return self._send(400, {"error": {"message": str(e)}})
                except TemplateRefusal as e:  # the chat template raised: the request is wrong, as vLLM says
                    return self._send(400, {"error": {"message": e.message}})
                self._send(200, result)

        return Handler

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve in a background thread; returns the base URL (port 0 picks a free port)."""
        self.httpd = ThreadingHTTPServer((host, port), self.handler())
        # stop() waits for handlers still generating, so torch is never torn down under a running thread
        self.httpd.daemon_threads = False
        self.httpd.block_on_close = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self.url

    @property
    def url(self) -> str:
        if self.httpd is None:
            raise RuntimeError("the server is not started: call start() first")
        host, port = self.httpd.server_address[:2]
        assert isinstance(host, str)  # an AF_INET address (bytes only for AF_UNIX)
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


def _bind(host: str, port: int, handler=BaseHTTPRequestHandler) -> ThreadingHTTPServer:
    """The listening server, or exit 2 with what is wrong (a port in use, an address not here)."""
    try:
        return ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        print(
            f"error: cannot listen on {host}:{port}: {e.strerror}\n"
            f"next: pick another --port (or stop what holds it: ss -ltnp 'sport = :{port}')",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m eagle3cli.data.http_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model", required=True, help="local transformers model folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--served-model-name", default=None, help="name reported by /v1/models (default: folder name)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=256, help="default when a request gives none")
    ap.add_argument("--fail-first", type=int, default=0, help="answer the first N POSTs with HTTP 500 (tests)")
    ap.add_argument("--bad-first", type=int, default=0, help="then answer the next B with a malformed 200 (tests)")
    ap.add_argument("--sleep-first", type=int, default=0, help="then sleep --sleep-s before the next M (tests)")
    ap.add_argument("--sleep-s", type=float, default=0.0)
    a = ap.parse_args(argv)
    from ..model.target import load_target

    _bind(a.host, a.port).server_close()  # a port in use is said before the model loads, not after
    model, tok, path = load_target(a.model, device=a.device)
    srv = ModelServer(
        model,
        tok,
        a.served_model_name or Path(path).name,
        a.fail_first,
        a.sleep_first,
        a.sleep_s,
        a.max_new_tokens,
        bad_first=a.bad_first,
    )
    srv.httpd = _bind(a.host, a.port, srv.handler())
    srv.httpd.daemon_threads = True
    print(f"serving {path} at http://{a.host}:{srv.httpd.server_address[1]}", flush=True)
    try:
        srv.httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
