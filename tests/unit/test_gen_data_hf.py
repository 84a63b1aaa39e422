"""The embedded hf backend: batching must not change text; multi-turn regeneration conditions on
the regenerated history; truncated turns are dropped or kept-and-flagged."""

from __future__ import annotations

import pytest
import torch

from eagle3cli.data.hf import HFBackend, encode_prompt
from eagle3cli.data.regen import Conversation, Sampling
from eagle3cli.model.target import load_target

PROMPTS = [
    "hi",
    "What is two plus two? Think step by step.",
    "a b c d e f g h i j k l m n o p q r s t",
    "Write a poem about the sea",
    "Natalia sold clips to 48 of her friends in April.",
]


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    model, tok, _ = load_target(tiny_target_dir)
    return model, tok


def test_batched_greedy_equals_per_sample_generate(target):
    model, tok = target
    b = HFBackend(model, tok, Sampling(max_new_tokens=12, temperature=0), batch_size=3)
    prompts = [encode_prompt(tok, [{"role": "user", "content": p}]) for p in PROMPTS]
    assert len({len(p) for p in prompts}) > 1  # really padded
    outs = b.generate_sorted(prompts, [0] * len(prompts))
    for p, o in zip(prompts, outs):
        ref = model.generate(
            torch.tensor([p]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=sorted(b.stop_ids),
            pad_token_id=b.pad_id,
        )[0, len(p) :]
        hit_eos = bool(ref.numel()) and int(ref[-1]) in b.stop_ids
        assert o.text == tok.decode(ref, skip_special_tokens=True)
        assert o.finish_reason == ("stop" if hit_eos else "length")
        assert o.completion_tokens == ref.numel() and o.prompt_tokens == len(p)


def test_sampling_does_not_depend_on_batch_composition(target):
    model, tok = target
    b = HFBackend(model, tok, Sampling(max_new_tokens=10, temperature=0.9, top_p=0.9), batch_size=8)
    prompts = [encode_prompt(tok, [{"role": "user", "content": p}]) for p in PROMPTS]
    together = b.generate_sorted(prompts, [11, 12, 13, 14, 15])
    alone = [b.generate([p], [s])[0] for p, s in zip(prompts[:2], [11, 12])]
    assert [o.text for o in alone] == [o.text for o in together[:2]]
    other_seed = b.generate([prompts[0]], [99])[0]
    assert other_seed.text != together[0].text


def _conv(index, users, original_answers=None, drop=False):
    msgs = [{"role": "system", "content": "You are terse."}]
    for i, u in enumerate(users):
        msgs.append({"role": "user", "content": u})
        if original_answers:
            msgs.append({"role": "assistant", "content": original_answers[i]})
    return Conversation(index, {"id": f"t:{index}", "source": "t", "messages": msgs, "meta": {"row": index}}, drop)


class PromptSpy(HFBackend):
    """Records the text of every prompt the model is run on (decoded from the ids it is fed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def generate(self, prompts, seeds=None, sampling=None):
        self.seen += [self.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        return super().generate(prompts, seeds, sampling)


def test_multi_turn_conditions_on_regenerated_turns(target):
    model, tok = target
    b = PromptSpy(model, tok, Sampling(max_new_tokens=8, temperature=0), batch_size=4)
    convs = [
        _conv(0, ["First question?", "Second question?", "Third?"], ["ORIGINAL-ONE", "ORIGINAL-TWO", "ORIGINAL-3"]),
        _conv(1, ["Only one turn here."]),
    ]
    finished = []
    b.regenerate(convs, finished.append)
    assert sorted(c.index for c in finished) == [0, 1] and finished[0].index == 1  # short one finishes first
    rec = convs[0].result()
    assert [m["role"] for m in rec["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    answers = [m["content"] for m in rec["messages"] if m["role"] == "assistant"]
    assert all(a.strip() for a in answers) and "ORIGINAL" not in "".join(answers)
    # record 0's prompts, by the last user turn they end with
    turn = {
        q: next(p for p in b.seen if p.rstrip().endswith(f"{q}<|im_end|>\n<|im_start|>assistant"))
        for q in ("First question?", "Second question?", "Third?")
    }
    assert len(b.seen) == 4  # three turns of record 0, one of record 1
    assert answers[0] in turn["Second question?"] and answers[0] in turn["Third?"]
    assert answers[1] in turn["Third?"] and answers[1] not in turn["Second question?"]
    assert "ORIGINAL" not in "".join(b.seen)
    assert turn["Third?"].startswith("<|im_start|>system\nYou are terse.")
    assert [t["prompt_tokens"] for t in rec["meta"]["turns"]] == sorted(
        t["prompt_tokens"] for t in rec["meta"]["turns"]
    )


def test_truncated_turns_dropped_or_flagged(target):
    model, tok = target
    b = HFBackend(model, tok, Sampling(max_new_tokens=2, temperature=0), batch_size=4)
    keep, drop = _conv(0, ["q1", "q2"]), _conv(1, ["q1", "q2"], drop=True)
    b.regenerate([keep, drop], lambda c: None)
    rec = keep.result()
    assert rec["meta"]["truncated"] and [t["finish_reason"] for t in rec["meta"]["turns"]] == ["length", "length"]
    assert drop.reject == ("truncated", drop.reject[1])


def test_prompt_too_long_is_rejected_not_crashed(target):
    model, tok = target
    b = HFBackend(model, tok, Sampling(max_new_tokens=4, temperature=0), batch_size=4, max_prompt_tokens=20)
    long, short = _conv(0, ["word " * 50]), _conv(1, ["hi"])
    b.regenerate([long, short], lambda c: None)
    assert long.reject[0] == "prompt_too_long" and short.reject is None
