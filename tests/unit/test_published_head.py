"""The published SmolLM2 head (models/smollm2-135m-eagle3, committed once; issue 22) is what the
docs say it is: bf16 weights under 30 MB, finite, a one-layer EAGLE-3 head whose config eagle3's
reader accepts without the target, for SmolLM2's 30 layers and 49,152-token vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3cli.head.check import load_head_tensors, nonfinite_tensors
from eagle3cli.head.read import read_head

HEAD = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-eagle3"


def test_published_head_is_small_bf16_and_finite():
    weights = HEAD / "model.safetensors"
    assert weights.stat().st_size <= 30 * 1024 * 1024
    tensors = load_head_tensors(weights)
    assert not nonfinite_tensors(tensors)
    floats = {k: v.dtype for k, v in tensors.items() if v.is_floating_point()}
    assert set(floats.values()) == {torch.bfloat16}, floats
    assert tensors["lm_head.weight"].shape == (16384, 576)


def test_published_head_reads_as_an_eagle3_head_for_smollm2():
    spec = read_head(HEAD, num_target_layers=30)
    cfg = json.loads((HEAD / "config.json").read_text())
    assert cfg["vocab_size"] == 49152 and cfg["draft_vocab_size"] == 16384
    assert tuple(spec.aux_layer_ids) == (2, 15, 27)
