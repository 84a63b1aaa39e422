"""A chat template is code from the model folder: one that loops costs one record, not the run."""

from __future__ import annotations

import time

import pytest

from eagle3cli.model.chat import TemplateRefusal, render
from eagle3cli.model.target import load_tokenizer

LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"


def test_a_looping_template_is_a_refusal_within_the_limit(tiny_target_dir, monkeypatch):
    tok = load_tokenizer(tiny_target_dir)
    tok.chat_template = LOOP
    monkeypatch.setenv("EAGLE3_TEMPLATE_SECONDS", "0.5")
    t0 = time.monotonic()
    with pytest.raises(TemplateRefusal, match="longer than 0.5 s"):
        render(tok, [{"role": "user", "content": "hi"}], True)
    assert time.monotonic() - t0 < 30  # stopped by the limit, not by finishing 10^10 iterations
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert render(tok, [{"role": "user", "content": "hi"}], True) == "hi"  # the alarm is gone afterwards
