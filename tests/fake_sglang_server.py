"""A stand-in for `python -m sglang.launch_server` in the fast tests (no tests here): the argv eagle3
builds, `/health`, and `/generate` answered as SGLang 0.5.23 answers it (`eagle3cli/engines/
sglang_capture.py` cites the code), the states computed by transformers in SGLang's conventions:

- `--enable-return-hidden-states`: each prompt row is the final state after the norm;
- `--enable-return-aux-hidden-states --return-aux-hidden-state-layer-ids ...`: the input of each
  layer id + 1 (Llama), concatenated in layer order, in place of the final state;
- `meta_info.hidden_states = [[T rows]]`, `prompt_tokens = T`, `output_ids = [greedy next token]`.

`FAKE_SGLANG_FAULT=KIND` from request `FAKE_SGLANG_FAULT_AT` (default 0) on answers as a broken
server would: `layers` (a layer short), `positions` (a row short), `garbled` (a cut JSON body),
`prenorm` (final states before the norm), `shifted` (each row one position late), `die` (the process exits mid-request); with
`FAKE_SGLANG_FAULT_PASS=final|aux` only the server of that pass is broken."""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import AutoModelForCausalLM


def answer(model, ids: list[int], layers: list[int] | None, fault: str) -> dict:
    seen = {}
    norm = model.model.norm
    hooks = [
        norm.register_forward_pre_hook(lambda _m, args: seen.update(pre=args[0])),
        norm.register_forward_hook(lambda _m, _args, output: seen.update(post=output)),
    ]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    for h in hooks:
        h.remove()
    hs = out.hidden_states
    if layers is None:
        rows = seen["pre" if fault == "prenorm" else "post"][0]
    else:  # captured in the loop over the layers: layer order, whatever order the ids came in
        capture = [k + 1 for k in layers]
        rows = torch.cat([hs[i][0] for i in range(model.config.num_hidden_layers) if i in capture], dim=-1)
        if fault == "layers":
            rows = rows[:, : -model.config.hidden_size]
    if fault == "positions":
        rows = rows[:-1]
    elif fault == "shifted":  # each row one position late
        rows = torch.cat([rows[:1], rows[:-1]])
    meta = {"id": "x", "prompt_tokens": len(ids), "completion_tokens": 1, "hidden_states": [rows.float().tolist()]}
    return {"text": "", "output_ids": [int(out.logits[0, -1].argmax())], "meta_info": meta}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--enable-return-aux-hidden-states", action="store_true")
    ap.add_argument("--return-aux-hidden-state-layer-ids", type=int, nargs="+")
    a, _ = ap.parse_known_args()
    model = AutoModelForCausalLM.from_pretrained(a.model_path, dtype=getattr(torch, a.dtype)).eval()
    layers = a.return_aux_hidden_state_layer_ids if a.enable_return_aux_hidden_states else None
    fault, at = os.environ.get("FAKE_SGLANG_FAULT", ""), int(os.environ.get("FAKE_SGLANG_FAULT_AT", "0"))
    if os.environ.get("FAKE_SGLANG_FAULT_PASS", "") not in ("", "aux" if layers is not None else "final"):
        fault = ""
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def reply(self, body: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self.reply(b"{}" if self.path == "/health" else b"", 200 if self.path == "/health" else 404)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            broken = fault if count[0] >= at else ""
            count[0] += 1
            if broken == "die":
                os._exit(9)
            body = json.dumps([answer(model, ids, layers, broken) for ids in req["input_ids"]]).encode()
            self.reply(body[: len(body) // 2] + b"\x00" * (len(body) - len(body) // 2) if broken == "garbled" else body)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
