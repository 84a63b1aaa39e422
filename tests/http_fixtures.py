"""An OpenAI-compatible endpoint over real HTTP that answers every chat request with fixed text, as a
misbehaving inference server would (a lone surrogate, an empty answer). No tests here."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FixedAnswerServer:
    """An OpenAI-compatible endpoint (real HTTP) that answers every chat request with `content`,
    as a misbehaving inference server would."""

    def __init__(self, content: str):
        raw = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": %s}, "finish_reason": "stop"}],'
        body = (raw % json.dumps(content) + '"usage": {"prompt_tokens": 3, "completion_tokens": 2}}').encode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                data = b'{"data": [{"id": "fixed"}]}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
