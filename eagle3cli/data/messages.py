"""The message schema of a normalised record: roles, reasoning, tool calls, and their validation.

A message is `{"role", "content"}` plus, for an assistant, an optional `reasoning_content`
(its thinking) and `tool_calls` (OpenAI `[{"type": "function", "function": {"name",
"arguments"}}]`, arguments kept as a mapping), and for a `tool` message an optional
`tool_call_id` / `name`. A record may carry `tools` (OpenAI function schemas) for the template.

Inputs name these in several ways; all are brought to this one form: reasoning as
`reasoning_content`, `reasoning` or `thinking`, or inline `<think>...</think>` at the start of
the content; ShareGPT `function_call` / `observation` turns (LLaMA-Factory's tool format).

A usable conversation: an optional leading system turn, then rounds of a user turn followed by
the assistant's steps (an assistant turn that calls tools, the tool results, ..., an answer), or
only user turns (a prompt-only source; gen-data writes the answers).
"""

from __future__ import annotations

import json

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ROLES = ("system", "user", "assistant", "tool")
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


class BadRecord(Exception):
    """A row that cannot be used; `reason` is a short stable key counted in the manifest."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


def _arguments(args, where: str):
    if isinstance(args, dict):
        return args
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise BadRecord("bad_tool_call", f"{where}: arguments are not JSON") from None
        if isinstance(parsed, dict):
            return parsed
    raise BadRecord("bad_tool_call", f"{where}: arguments must be a JSON object")


def tool_calls(calls, where: str) -> list[dict]:
    """OpenAI tool calls (or bare `{name, arguments}` objects) -> the schema's form."""
    if not isinstance(calls, list) or not calls:
        raise BadRecord("bad_tool_call", f"{where}: tool_calls must be a non-empty list")
    out = []
    for k, c in enumerate(calls):
        fn = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRecord("bad_tool_call", f"{where} call {k}: no function name")
        call = {
            "type": "function",
            "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments", {}), where)},
        }
        if isinstance(c.get("id"), str):
            call["id"] = c["id"]
        out.append(call)
    return out


def split_inline_reasoning(content: str) -> tuple[str | None, str]:
    """`<think>R</think>A` at the start of an answer -> (R, A); other text -> (None, text)."""
    head = content.lstrip()
    if head.startswith(THINK_OPEN) and THINK_CLOSE in head:
        reasoning, _, answer = head[len(THINK_OPEN) :].partition(THINK_CLOSE)
        return reasoning.strip("\n"), answer.lstrip("\n")
    return None, content


def message(role: str, t: dict, where: str) -> dict:
    """One input message (role already mapped to ours) -> the schema's form; BadRecord if unusable."""
    content = t.get("content")
    if content is None and role == "assistant" and t.get("tool_calls"):
        content = ""  # OpenAI: an assistant turn that only calls tools has content null
    if isinstance(content, list):  # OpenAI content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise BadRecord("non_string_content", f"{where} has non-text content parts")
        content = "".join(p.get("text", "") for p in content)
    m = {"role": role, "content": content}
    if role == "assistant":
        reasoning = next((t[k] for k in _REASONING_KEYS if isinstance(t.get(k), str) and t[k].strip()), None)
        if reasoning is None and isinstance(content, str):
            reasoning, m["content"] = split_inline_reasoning(content)
        if reasoning:
            m["reasoning_content"] = reasoning
        if t.get("tool_calls"):
            m["tool_calls"] = tool_calls(t["tool_calls"], where)
    if role == "tool":
        for k in ("tool_call_id", "name"):
            if isinstance(t.get(k), str):
                m[k] = t[k]
    return m


def sharegpt_function_call(value, where: str) -> dict:
    """A ShareGPT `function_call` turn: its value is the call as JSON (`{name, arguments}` or a list)."""
    try:
        calls = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        raise BadRecord("bad_tool_call", f"{where}: function_call value is not JSON") from None
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": tool_calls(calls if isinstance(calls, list) else [calls], where),
    }


def record_tools(row: dict) -> list | None:
    """The row's tool schemas (`tools`, a list or its JSON text), or None."""
    tools = row.get("tools")
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise BadRecord("bad_tools", "tools is not JSON") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRecord("bad_tools", "tools must be a list of function schemas")
    return [t if "function" in t else {"type": "function", "function": t} for t in tools]


def check_conversation(messages: list[dict]) -> None:
    """Raise BadRecord unless the turns form a usable conversation (module doc)."""
    if not isinstance(messages, list) or not messages:
        raise BadRecord("missing_fields", "no turns")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRecord("missing_fields", f"turn {i} is not an object")
        if m.get("role") not in ROLES:
            raise BadRecord("unknown_role", f"turn {i} role {m.get('role')!r}")
        c = m.get("content")
        if not isinstance(c, str):
            raise BadRecord("non_string_content", f"turn {i} content is {type(c).__name__}")
        if not c.strip() and not m.get("tool_calls") and not (m.get("reasoning_content") or "").strip():
            raise BadRecord("empty_content", f"turn {i} ({m['role']}) is empty")
    roles = [m["role"] for m in messages]
    lead = 1 if roles[0] == "system" else 0
    body = messages[lead:]
    if any(m["role"] == "system" for m in body):
        raise BadRecord("wrong_role_order", "system turn after the start")
    if not any(m["role"] == "user" for m in body):
        raise BadRecord("no_user_turn", "no user turn")
    if body[0]["role"] != "user":
        raise BadRecord("wrong_role_order", f"first turn is {body[0]['role']}, expected user")
    if not any(m["role"] == "assistant" for m in body):
        if any(m["role"] == "tool" for m in body):
            raise BadRecord("wrong_role_order", "tool results without an assistant turn that called the tool")
        return  # prompt-only
    # user (assistant-with-calls tool+)* assistant, repeated; a trailing unanswered user turn is allowed
    prev = None
    for k, m in enumerate(body):
        i, r = k + lead, m["role"]
        if r == "user":
            ok = prev in (None, "answer")
        elif r == "tool":
            ok = prev in ("call", "tool")
        else:
            ok = prev in ("user", "tool")
        if not ok:
            raise BadRecord(
                "wrong_role_order",
                f"turn {i} is {r} after {prev or 'the start'}: turns must alternate user/assistant "
                "(tool results right after the assistant turn that called them)",
            )
        prev = "call" if r == "assistant" and m.get("tool_calls") else ("answer" if r == "assistant" else r)
    if prev in ("call", "tool"):
        raise BadRecord("wrong_role_order", "the conversation ends inside a tool call (no final answer)")


def _plain_turn(m) -> bool:
    """A user/assistant turn of text only (no tool calls, no reasoning): safe to join with a neighbour."""
    return (
        isinstance(m, dict)
        and m.get("role") in ("user", "assistant")
        and isinstance(m.get("content"), str)
        and bool(m["content"].strip())
        and not m.get("tool_calls")
        and not m.get("reasoning_content")
    )


def repair_roles(messages: list[dict]) -> tuple[list[dict], list[str]]:
    """The turn-order repairs chat-data pipelines make before rejecting a conversation, and which
    were made: `dropped_leading_assistant` (assistant turns before the first user turn, e.g. a
    ShareGPT export that starts with the bot's greeting) and `merged_user_turns` /
    `merged_assistant_turns` (two text turns of one role in a row, joined by a blank line: a reply
    split in two by the exporter). About a third of ShareGPT V3 is rejected without them.
    Prompt-only conversations (no assistant turn, e.g. MT-bench's two questions) are left as they
    are: each user turn is a question to answer in order."""
    if not isinstance(messages, list) or not any(
        isinstance(m, dict) and m.get("role") == "assistant" for m in messages
    ):
        return messages, []
    lead = 1 if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" else 0
    body, repairs = list(messages[lead:]), []
    first_user = next((i for i, m in enumerate(body) if isinstance(m, dict) and m.get("role") == "user"), None)
    if first_user and all(_plain_turn(m) and m["role"] == "assistant" for m in body[:first_user]):
        body = body[first_user:]
        repairs.append("dropped_leading_assistant")
    out: list[dict] = []
    for m in body:
        if out and _plain_turn(m) and _plain_turn(out[-1]) and out[-1]["role"] == m["role"]:
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n\n" + m["content"]}
            kind = f"merged_{m['role']}_turns"
            if kind not in repairs:
                repairs.append(kind)
        else:
            out.append(m)
    return (messages[:lead] + out, repairs) if repairs else (messages, [])
