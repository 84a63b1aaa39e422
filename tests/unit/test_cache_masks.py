"""Assistant loss masks by character offsets, on three template families built locally."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import AddedToken
from transformers import AutoTokenizer

from eagle3cli.cache.masks import check_template, mask_conversation
from eagle3cli.errors import UsageError

TINY = Path(__file__).resolve().parents[2] / "models" / "tiny-target"

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}</s>{% endif %}{% endfor %}"
)
# A template that wraps assistant text in markup: masks by offsets must refuse it, not guess.
BROKEN = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
    "{{ m['content'] | upper }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
)

STYLES = {
    # name: (special tokens to add, template, bos, eos, expected end-of-turn token)
    "chatml": ([], None, None, None, "<|im_end|>"),
    "llama3": (
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        LLAMA3,
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|eot_id|>",
    ),
    "mistral": (["<s>", "</s>", "[INST]", "[/INST]"], MISTRAL, "<s>", "</s>", "</s>"),
    "broken": ([], BROKEN, None, None, "<|im_end|>"),
}


def make_tokenizer(out: Path, style: str):
    """The committed tokenizer with another family's special tokens and chat template, saved and reloaded."""
    specials, template, bos, eos, _ = STYLES[style]
    tok = AutoTokenizer.from_pretrained(str(TINY))
    if specials:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in specials], special_tokens=True)
    if template:
        tok.chat_template = template
    if bos:
        tok.bos_token = bos
    if eos:
        tok.eos_token = eos
    d = out / style
    tok.save_pretrained(str(d))
    return AutoTokenizer.from_pretrained(str(d))


@pytest.fixture(scope="module", params=["chatml", "llama3", "mistral"])
def styled(request, tmp_path_factory):
    return request.param, make_tokenizer(tmp_path_factory.mktemp("tok"), request.param)


MULTI = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say assistant twice, then echo: 12 + 30 = 42"},
    {"role": "assistant", "content": "assistant assistant"},
    {"role": "user", "content": "12 + 30 = 42"},
    {"role": "assistant", "content": "12 + 30 = 42"},
    {"role": "user", "content": "Thanks!\n"},
    {"role": "assistant", "content": "  You're welcome.\nBye."},
]


def _masked_runs(ids, mask):
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def test_masks_are_exactly_assistant_text_plus_end_token(styled):
    style, tok = styled
    msgs = [m for m in MULTI if style != "mistral" or m["role"] != "system"]
    s = mask_conversation(tok, msgs, max_length=4096)
    end = STYLES[style][4]
    end_id = tok.convert_tokens_to_ids(end)
    answers = [m["content"] for m in msgs if m["role"] == "assistant"]
    runs = _masked_runs(s.input_ids, s.loss_mask)
    assert len(runs) == len(answers) == len(s.turns)
    for run, answer in zip(runs, answers):
        assert run[-1] == end_id, f"{style}: turn does not end with {end}"
        assert tok.decode(run[:-1]).strip() == answer.strip()
    # Nothing outside the assistant turns is trainable: headers, user text, system text.
    unmasked = tok.decode([i for i, m in zip(s.input_ids, s.loss_mask) if not m])
    assert "You are terse." in unmasked or style == "mistral"
    assert "Thanks!" in unmasked
    # The ids are exactly the template's own tokenisation (what the target sees at serve time).
    assert s.input_ids == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]


def test_answer_that_repeats_the_question_is_masked_at_its_own_place(styled):
    _, tok = styled
    msgs = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "hello world"}]
    s = mask_conversation(tok, msgs, max_length=4096)
    first = s.turns[0][0]
    # The user's copy comes first; every masked token lies after it.
    user_end = tok.apply_chat_template(msgs[:1], tokenize=False).index("hello world") + len("hello world")
    enc = tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False, return_offsets_mapping=True)
    assert enc["offset_mapping"][first][0] >= user_end


def test_truncation_keeps_prefix_and_reports_it(styled):
    _, tok = styled
    s_full = mask_conversation(tok, MULTI[1:], max_length=4096)
    s = mask_conversation(tok, MULTI[1:], max_length=20)
    assert s.truncated and s.full_length == len(s_full.input_ids) > 20
    assert s.input_ids == s_full.input_ids[:20] and s.loss_mask == s_full.loss_mask[:20]


def test_template_that_rewrites_assistant_text_stops_the_run(tmp_path):
    tok = make_tokenizer(tmp_path, "broken")
    with pytest.raises(UsageError, match="chat template breaks assistant loss masking"):
        check_template(tok)


def test_check_template_passes_on_the_three_families(styled):
    check_template(styled[1])


def test_template_that_refuses_a_conversation_is_a_usage_error(tmp_path):
    tok = make_tokenizer(tmp_path, "chatml")
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(UsageError, match="refuses this conversation.*no system role"):
        mask_conversation(tok, MULTI, max_length=4096, sample_id="s1")


def test_turn_cut_by_max_new_tokens_does_not_train_the_end_token(styled):
    """gen-data flags turns stopped by max_new_tokens; the template still closes them, the target did not."""
    from eagle3cli.cache.masks import cut_turns

    style, tok = styled
    msgs = [m for m in MULTI if style != "mistral" or m["role"] != "system"]
    record = {
        "messages": msgs,
        "meta": {"turns": [{"finish_reason": "stop"}, {"finish_reason": "length"}, {"finish_reason": "stop"}]},
    }
    assert cut_turns(record) == {1}
    full = mask_conversation(tok, msgs, max_length=4096)
    cut = mask_conversation(tok, msgs, max_length=4096, cut_turns=cut_turns(record))
    end_id = tok.convert_tokens_to_ids(STYLES[style][4])
    runs_full, runs_cut = _masked_runs(full.input_ids, full.loss_mask), _masked_runs(cut.input_ids, cut.loss_mask)
    assert runs_cut[0] == runs_full[0] and runs_cut[2] == runs_full[2]
    assert runs_full[1][-1] == end_id and runs_cut[1] == runs_full[1][:-1]
