"""OpenAI-compatible endpoints over real HTTP that misbehave as inference servers do: fixed text (a lone
surrogate, an empty answer), or hostile bodies (a gzip bomb, JSON nested thousands deep, Infinity, a
body that never ends or drips). No tests here."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ThreadedServer:
    """A local HTTP server for one handler class, in a background thread: `.url`, `.stop()`."""

    def serve(self, handler: type[BaseHTTPRequestHandler], daemon_threads: bool = False) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = daemon_threads
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class FixedAnswerServer(ThreadedServer):
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

        self.serve(Handler)


def gzip_bomb(inflated_gib: int = 4) -> bytes:
    """A single-member gzip stream of `inflated_gib` GiB of zeros in ~4 MB, built in a second: one
    64 MiB block compressed once and ended with a full flush (so it refers to nothing before it),
    repeated. The trailer's CRC is not computed: a reader that gets that far has already lost."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(64 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + block * (16 * inflated_gib) + c.flush() + b"\0" * 8


def _answer(
    content: str, usage: str = '{"prompt_tokens": 3, "completion_tokens": 2}', message_extra: str = ""
) -> bytes:
    msg = '{"role": "assistant", "content": ' + json.dumps(content) + message_extra + "}"
    return (
        '{"choices": [{"index": 0, "message": ' + msg + ', "finish_reason": "stop"}], "usage": ' + usage + "}"
    ).encode()


class HostileServer(ThreadedServer):
    """An OpenAI-compatible endpoint that answers by the last user turn's text, as a hostile server
    would: `bomb` (a gzip body inflating to 4 GiB), `deep` (tool-call arguments nested 5000 deep),
    `inf` (usage holding Infinity), `endless` (a chunked body that never ends), `drip` (one byte a
    second, forever); anything else gets a plain answer."""

    def __init__(self):
        bomb = gzip_bomb()
        nested = "[" * 5000 + "]" * 5000
        deep = (
            ', "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ' + nested + "}}]"
        )

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, body: bytes, extra: dict | None = None):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                kind = req["messages"][-1]["content"].strip()
                try:
                    if kind == "bomb":
                        self._send(bomb, {"Content-Encoding": "gzip"})
                    elif kind == "deep":
                        self._send(_answer("", message_extra=deep))
                    elif kind == "inf":
                        self._send(_answer("ok", usage='{"prompt_tokens": Infinity, "completion_tokens": 2}'))
                    elif kind in ("endless", "drip"):
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        piece = b" " * (1 if kind == "drip" else 1 << 16)
                        while True:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                            self.wfile.flush()
                            if kind == "drip":
                                time.sleep(1.0)
                    else:
                        self._send(_answer(f"an answer to {kind}"))
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                self._send(b'{"data": [{"id": "hostile"}]}')

            def log_message(self, *a):
                pass

        self.serve(Handler, daemon_threads=True)


@contextmanager
def running(*servers: ThreadedServer) -> Iterator[tuple]:
    """The servers, stopped when the block ends (a fixture's `with running(a, b) as pair: yield pair`)."""
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()
