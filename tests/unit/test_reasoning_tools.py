"""Reasoning models and tool calls, with the family templates of tests/family_fixtures.py:
inputs normalise to one message schema; masks hold exactly what the model writes per turn
(thinking included, for multi-turn templates that drop earlier turns' thinking too); tool
results are never trained; templates that refuse a conversation reject the record."""

from __future__ import annotations

import json

import pytest
from family_fixtures import CALL, FAMILIES, THINK, TOOL_CONV, TOOLS, family_tokenizer

from eagle3cli.cache.masks import TemplateRefusal, mask_record
from eagle3cli.data.formats import parse_input_spec, read_input
from eagle3cli.data.regen import Conversation, TurnOutput, template_kwargs_for


def masked_texts(tok, sample) -> list[str]:
    """Each run of trained tokens, decoded (end-of-turn token included)."""
    out, i, mask = [], 0, sample.loss_mask
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            out.append(tok.decode(sample.input_ids[i:j]))
            i = j
        else:
            i += 1
    return out


# ---------------------------------------------------------------- inputs
def test_openai_messages_with_reasoning_and_tool_calls_normalise(tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    good = {
        "id": "t1",
        "tools": json.dumps(TOOLS),
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning": "Need the tool.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "<think>\nIt is 21.\n</think>\n\nIt is 21 degrees."},
        ],
    }
    bad = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [call]}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
            ]
        },
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [good, *bad]))
    res = read_input(parse_input_spec(str(path)))
    (rec,) = res.records
    msgs = rec["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[1] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the tool.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}, "id": "c1"}
        ],
    }
    assert msgs[2]["tool_call_id"] == "c1"
    assert msgs[3]["reasoning_content"] == "It is 21." and msgs[3]["content"] == "It is 21 degrees."
    assert rec["tools"][0]["function"]["name"] == "get_weather"
    assert sorted(r["reason"] for r in res.rejects) == ["bad_tool_call", "bad_tool_call", "wrong_role_order"] + [
        "wrong_role_order"
    ]


def test_sharegpt_function_call_and_observation_turns(tmp_path):
    row = {
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
            {"from": "observation", "value": '{"temp": 21}'},
            {"from": "gpt", "value": "It is 21 degrees."},
        ],
        "tools": json.dumps([TOOLS[0]["function"]]),
    }
    path = tmp_path / "sg.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (rec,) = read_input(parse_input_spec(str(path))).records
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert rec["messages"][1]["tool_calls"] == [CALL] and rec["tools"] == TOOLS


# ---------------------------------------------------------------- masks
@pytest.mark.parametrize(
    "name,turn1,turn3",
    [
        (
            "qwen3",
            "<think>\nAdd two and three.\n</think>\n\nIt is 5.<|im_end|>",
            "<think>\nTwo plus four is six.\n</think>\n\n6.<|im_end|>",
        ),
        (
            "gpt-oss",
            "<|channel|>analysis<|message|>Add two and three.<|end|><|start|>assistant<|channel|>final<|message|>It is 5."
            "<|return|>",
            "<|channel|>analysis<|message|>Two plus four is six.<|end|><|start|>assistant<|channel|>final<|message|>6."
            "<|return|>",
        ),
    ],
)
def test_multi_turn_thinking_trains_every_turn_with_its_reasoning(name, turn1, turn3):
    """The template drops turn 1's thinking once a later user turn exists; what the model wrote at
    turn 1 (thinking included) is trained in a sample of its own that ends there."""
    tok = family_tokenizer(FAMILIES[name])
    full, alone = mask_record(tok, THINK, 4096, "s")
    assert (full.suffix, alone.suffix) == ("", "#t1")
    assert masked_texts(tok, full) == [turn3]  # turn 1 is there without its thinking: not trained there
    assert masked_texts(tok, alone) == [turn1]
    assert tok.decode(alone.input_ids).endswith(turn1 if name == "gpt-oss" else turn1 + "\n")


def test_thinking_off_trains_the_answer_after_the_empty_think_block_of_the_prompt():
    tok = family_tokenizer(FAMILIES["qwen3"])
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in THINK]
    (s,) = mask_record(tok, plain, 4096, "s", template_kwargs={"enable_thinking": False})
    assert masked_texts(tok, s) == ["It is 5.<|im_end|>", "6.<|im_end|>"]


TOOL_MASKS = {
    "qwen2.5": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "It is 21 degrees in Paris.<|im_end|>",
        "You are welcome.<|im_end|>",
    ],
    "qwen3": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "It is 21 degrees in Paris.<|im_end|>",
        "<think>\n\n</think>\n\nYou are welcome.<|im_end|>",
    ],
    "llama3.1": [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        "It is 21 degrees in Paris.<|eot_id|>",
        "You are welcome.<|eot_id|>",
    ],
    "gpt-oss": [
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        "<|channel|>final<|message|>It is 21 degrees in Paris.<|end|>",
        "<|channel|>final<|message|>You are welcome.<|return|>",
    ],
}


@pytest.mark.parametrize("name", list(TOOL_MASKS))
def test_tool_calls_are_trained_and_tool_results_are_not(name):
    tok = family_tokenizer(FAMILIES[name])
    (s,) = mask_record(tok, TOOL_CONV, 4096, "s", tools=TOOLS)
    got = masked_texts(tok, s)
    assert got == TOOL_MASKS[name]
    assert not any('"temp": 21' in g for g in got)  # the tool's output is input, never a target
    assert "get_weather" in tok.decode(s.input_ids)  # the schemas reached the template


@pytest.mark.parametrize(
    "name,conv,message",
    [
        ("gemma2", [{"role": "system", "content": "Be brief."}, *THINK[:2]], "System role not supported"),
        ("mistral", TOOL_CONV, "roles must alternate"),
    ],
)
def test_a_template_that_refuses_the_conversation_raises_a_refusal(name, conv, message):
    with pytest.raises(TemplateRefusal, match=message) as e:
        mask_record(family_tokenizer(FAMILIES[name]), conv, 4096, "s", tools=TOOLS)
    assert e.value.reason == "template_refused"


# ---------------------------------------------------------------- regeneration plan
def test_tool_conversations_regenerate_answers_and_keep_calls_and_results():
    rec = {"id": "r", "source": "s", "messages": TOOL_CONV, "tools": TOOLS, "meta": {"row": 0}}
    c = Conversation(0, rec, template_kwargs={"enable_thinking": True})
    assert c.slots == [3, 5]  # the tool-calling turn is kept: its result is in the data
    assert c.history() == TOOL_CONV[:3]
    c.add(TurnOutput("Warm: 21.", "stop", 10, 4, reasoning="The tool says 21."))
    assert c.history()[:3] == TOOL_CONV[:3] and c.history()[3]["reasoning_content"] == "The tool says 21."
    c.add(TurnOutput("Bye.", "length", 20, 3))
    out = c.result()
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert out["messages"][1] == TOOL_CONV[1] and out["tools"] == TOOLS
    assert [t["finish_reason"] for t in out["meta"]["turns"]] == ["original", "stop", "length"]
    assert out["meta"]["chat_template_kwargs"] == {"enable_thinking": True}


def test_an_answer_that_calls_a_tool_without_a_result_in_the_data_stops_there():
    rec = {"id": "r", "source": "s", "messages": THINK, "meta": {}}
    c = Conversation(0, rec)
    c.add(TurnOutput("", "stop", 5, 5, tool_calls=[CALL]))
    assert c.done and c.stopped_early
    out = c.result()
    assert out["messages"][-1]["tool_calls"] == [CALL] and out["meta"]["dropped_turns"] == 1


def test_thinking_settings_per_record_are_seeded():
    on = template_kwargs_for(0, "a", "on", ())
    assert on == {"enable_thinking": True} and template_kwargs_for(0, "a", "off", ()) == {"enable_thinking": False}
    mix = [template_kwargs_for(0, f"r{i}", "mix", ("low", "high")) for i in range(200)]
    assert mix == [template_kwargs_for(0, f"r{i}", "mix", ("low", "high")) for i in range(200)]
    thinking = sum(m["enable_thinking"] for m in mix)
    assert 70 < thinking < 130 and {m["reasoning_effort"] for m in mix} == {"low", "high"}
    assert template_kwargs_for(0, "a", "default", ()) == {}
