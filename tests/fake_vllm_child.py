"""A stand-in for `eagle3cli/engines/vllm_capture_child.py` in the fast tests (no tests here): the same
argv and protocol, the states computed by transformers in vLLM's conventions (layer id k < L =
`hidden_states[k]`, id L = the last layer's output BEFORE the final norm), one safetensors file per
sequence, as vLLM's connector writes them.

`FAKE_ENGINE_FAULT=KIND` from request `FAKE_ENGINE_FAULT_AT` (default 0) on returns what a broken
engine would: `layers` (one layer short), `positions` (one position short), `tokens` (other token
ids), `truncate` (a cut file), `keys` (no token_ids), `die` (the process exits mid-request)."""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def states(model, ids: list[int], layer_ids: list[int]) -> torch.Tensor:
    """[T, len(layer_ids), H] in vLLM's convention."""
    seen = {}
    handle = model.model.norm.register_forward_pre_hook(lambda _m, args: seen.update(pre=args[0]))
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    handle.remove()
    n = model.config.num_hidden_layers
    return torch.stack([seen["pre"][0] if k == n else out.hidden_states[k][0] for k in layer_ids], dim=1)


def main(spec: dict, proto_fd: int) -> None:
    proto = os.fdopen(proto_fd, "w", buffering=1)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype).eval()
    fault, at = os.environ.get("FAKE_ENGINE_FAULT", ""), int(os.environ.get("FAKE_ENGINE_FAULT_AT", "0"))
    os.makedirs(spec["states_dir"], exist_ok=True)
    proto.write(json.dumps({"ready": True, "platform": "cpu", "connector": "fake"}) + "\n")
    for n_req, line in enumerate(sys.stdin):
        req = json.loads(line)
        broken = fault if n_req >= at else ""
        if broken == "die":
            os._exit(9)
        paths = []
        for i, ids in enumerate(req["prompts"]):
            hs = states(model, ids, spec["layer_ids"])
            tensors = {"hidden_states": hs, "token_ids": torch.tensor(ids)}
            if broken == "layers":
                tensors["hidden_states"] = hs[:, :-1]
            elif broken == "positions":
                tensors["hidden_states"] = hs[:-1]
            elif broken == "tokens":
                tensors["token_ids"] = torch.tensor(ids) + 1
            elif broken == "keys":
                del tensors["token_ids"]
            path = os.path.join(spec["states_dir"], f"{req['id']}-{i}.safetensors")
            save_file({k: v.contiguous() for k, v in tensors.items()}, path)
            if broken == "truncate":
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
            paths.append(path)
        proto.write(json.dumps({"id": req["id"], "paths": paths}) + "\n")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]))
