"""Eval prompts never enter a training corpus: checked by text (data/contamination.py)."""

from __future__ import annotations

import json

from eagle3cli.data.config import GenDataConfig
from eagle3cli.data.contamination import EvalIndex, drop_eval_prompts, eval_index
from eagle3cli.data.run import run_gen_data
from eagle3cli.readers.sources import bundled


def _rec(i: int, *users: str) -> dict:
    msgs = [m for u in users for m in ({"role": "user", "content": u}, {"role": "assistant", "content": "ok"})]
    return {"id": f"t:{i}", "source": "t", "messages": msgs, "meta": {"row": i}}


def test_a_copied_eval_prompt_is_rejected_by_text_whatever_its_id_case_or_spacing():
    mt = json.loads(bundled("mt_bench_questions.jsonl").read_text().splitlines()[0])
    q1, q2 = mt["turns"]
    idx = eval_index(("mt_bench:test",))
    assert idx.benches["mt_bench:test"] == 160
    recs = [
        _rec(0, "  " + q1.upper().replace(" ", "   ") + "\n"),  # same text, other case and spacing
        _rec(1, "Hello there", "As my teacher asked: " + q1 + " Thanks!"),  # pasted into a later turn
        _rec(4, "hi", q2.lower()),  # a short follow-up matches whole
        _rec(2, "Write a haiku about the sea."),
        _rec(3, q1.split()[0]),  # one word of it is not the prompt
    ]
    kept, rejects = drop_eval_prompts(recs, idx)
    assert [r["id"] for r in kept] == ["t:2", "t:3"]
    assert [r["reason"] for r in rejects] == ["eval_prompt"] * 3
    assert "mt_bench:test" in rejects[0]["detail"]


def test_short_eval_prompts_match_whole_and_shared_boilerplate_is_not_a_copy():
    idx = EvalIndex()
    idx.add("b", "What is 2+2 today?")
    idx.add("b", "continue")  # everyone's turn, not the bench's
    boiler = "Web search results: use the provided results to write a comprehensive reply citing each with its number. "
    idx.add("b", boiler + "Query: how do tides work and why are there two of them each day on most coasts?")
    assert idx.match(_rec(0, "what is 2 + 2 today")) == "b"
    assert idx.match(_rec(1, "What is 2+2 today? And why does it matter to my tax return?")) is None
    assert idx.match(_rec(2, "Continue")) is None
    assert idx.match(_rec(3, boiler + "Query: best pizza dough recipe with a long cold ferment please")) is None
    assert (
        idx.match(_rec(4, boiler + "Query: How do tides work and why are there two of them each day on most coasts?"))
        == "b"
    )


def test_gen_data_rejects_eval_prompts_and_records_the_check(tiny_target_dir, tmp_path):
    mt = [json.loads(line) for line in bundled("mt_bench_questions.jsonl").read_text().splitlines()[:2]]
    rows = [{"id": "a", "messages": [{"role": "user", "content": mt[0]["turns"][0]}]}]
    rows += [{"id": "b", "messages": [{"role": "user", "content": "Name three colours of the sky."}]}]
    rows += [{"id": "c", "messages": [{"role": "user", "content": mt[1]["turns"][1].lower()}]}]
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = GenDataConfig(
        target=str(tiny_target_dir),
        inputs=(str(p),),
        out=tmp_path / "d",
        max_new_tokens=4,
        temperature=0.0,
        device="cpu",
    )
    out = run_gen_data(cfg)
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 1 and m["counts"]["skipped_by_reason"] == {"eval_prompt": 2}
    assert m["eval_prompt_check"]["rejected"] == 2 and m["eval_prompt_check"]["benches"]["mt_bench:test"] == 160
    assert m["config"]["exclude_eval"] is True
    # --keep-eval is another plan: the same folder refuses it
    kept = run_gen_data(GenDataConfig(**{**cfg.__dict__, "exclude_eval": False, "out": tmp_path / "k"}))
    assert json.loads((kept / "manifest.json").read_text())["counts"]["written"] == 3
