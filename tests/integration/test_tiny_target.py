"""The committed small target: loads offline, is actually trained, chats through its template."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.integration

# Measured when the target was built: 2.95 on 200 GSM8K-test answers (training_stats.json); a random
# 4096-token model scores ln(4096) = 8.3 nats/token. The bound leaves room for thread-count noise.
HELDOUT_LOSS_BOUND = 3.3


@pytest.fixture(scope="module")
def loaded(trained_target_dir):
    tok = AutoTokenizer.from_pretrained(str(trained_target_dir))
    model = AutoModelForCausalLM.from_pretrained(str(trained_target_dir), dtype=torch.float32).eval()
    return tok, model


def test_shape_and_size_on_disk(trained_target_dir, loaded):
    _, model = loaded
    cfg = model.config
    assert cfg.num_hidden_layers >= 12
    assert len({2, cfg.num_hidden_layers // 2, cfg.num_hidden_layers - 3}) == 3
    n = sum(p.numel() for p in model.parameters())
    assert 1e6 < n < 8e6
    total = sum(p.stat().st_size for p in trained_target_dir.iterdir() if p.is_file())
    assert total <= 16 * 2**20


def test_chat_template_renders_roles_and_generation_prompt(loaded):
    tok, _ = loaded
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    )
    gen = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert gen.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id


def test_heldout_gsm8k_loss_below_bound(loaded, bundled_data):
    tok, model = loaded
    rows = [json.loads(x) for x in (bundled_data / "gsm8k_test.jsonl").read_text().splitlines()[:40]]
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
            )
            full = prompt + r["answer"] + "<|im_end|>\n"
            n_prompt = len(tok(prompt)["input_ids"])
            ids = torch.tensor([tok(full)["input_ids"]])
            logits = model(input_ids=ids).logits[0, :-1]
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")[n_prompt - 1 :]
            total += nll.sum().item()
            count += nll.numel()
    assert total / count < HELDOUT_LOSS_BOUND, total / count


def test_generates_gsm8k_style_answer(loaded, bundled_data):
    tok, model = loaded
    q = json.loads((bundled_data / "gsm8k_test.jsonl").read_text().splitlines()[1])["question"]
    ids = tok.apply_chat_template(
        [{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=200, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert out[0, -1].item() == tok.eos_token_id, "the answer should end with <|im_end|>"
    assert "####" in answer and any(ch.isdigit() for ch in answer)
    assert "<<" in answer  # GSM8K's calculator annotations: the style was learnt
