"""The whole chain on a tiny random target of every family users train heads for (Llama-3.1,
Qwen2.5, Qwen3, Mistral with a short window, Qwen3-MoE, Gemma-2, Gemma-3, gpt-oss):
gen-data -> cache -> train (a few steps) -> export -> serve --dry-run (SGLang and vLLM) -> eval
(greedy chain and tree, prompts longer than the sliding window). Greedy output must be exactly the target's; the
head must be one the engine table accepts, or be refused before launch with a clear message.

Eval on sliding-window targets (Mistral, Gemma-2, Gemma-3, gpt-oss) runs past the window: the
decoder keeps every key and gives sliding layers their window through the mask.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from family_fixtures import ENGINE_SUPPORT, FAMILIES, build_family_target
from train_fixtures import eagle3 as run_eagle3

QUESTIONS = [
    "What is the sum of the first ten odd numbers?",
    "Name three prime numbers larger than twenty.",
    "Explain why the sky looks blue during the day.",
    "Write a haiku about a quiet mountain lake.",
    "How many legs do four spiders have in total?",
    "Give a short recipe for a cup of green tea.",
    "What is the capital city of Australia?",
    "Describe the water cycle in two sentences.",
    "Convert 100 degrees Fahrenheit to Celsius.",
    "List the planets of the solar system in order.",
    "Why do leaves change colour in autumn?",
    "Suggest a name for a friendly robot.",
]
# Eval prompts well past every family's window (32-48 tokens) before generation even starts.
LONG = " ".join(f"Step {i}: add {i} apples to the basket and count them again." for i in range(1, 9))


def eagle3(*args, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_eagle3(*args, timeout=timeout)


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", list(FAMILIES))
def test_chain_on_every_family(name, tmp_path):
    fam = FAMILIES[name]
    target = build_family_target(name, tmp_path / "target")
    run = tmp_path / "run"
    rows = [{"id": f"q{i}", "messages": [{"role": "user", "content": q}]} for i, q in enumerate(QUESTIONS)]
    rows.append(
        {
            "id": "sys",
            "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi?"}],
        }
    )
    inp = tmp_path / "prompts.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))

    # gen-data: the target answers (sampled, so a random model still writes text)
    flags = ["--temperature", "1", "--top-p", "1", "--max-new-tokens", "32", "--seed", "1"]
    if fam.thinking:
        flags += ["--thinking", "mix"]
    _ok(eagle3("gen-data", "--target", target, "--input", inp, "--run", run, *flags))
    rejects = [json.loads(x) for x in (run / "data" / "rejects.jsonl").read_text().splitlines()]
    refused = [r for r in rejects if r["reason"] == "template_refused"]
    assert [r["id"].split(":")[1] for r in refused] == (["sys"] if name == "gemma2" else [])
    written = json.loads((run / "data" / "manifest.json").read_text())["counts"]["written"]
    assert written >= 8

    # cache: masks self-checked per turn; aux layers as SGLang captures them
    _ok(eagle3("cache", "--run", run, "--max-length", "192", "--draft-vocab-size", "512", "--token-budget", "2048"))
    cache = json.loads((run / "cache" / "manifest.json").read_text())
    assert cache["aux_layer_ids"] == [2, 3, 3] and cache["counts"]["masked_tokens"] > 0

    # train a few steps, export the head
    _ok(
        eagle3(
            "train", "--run", run, "--max-steps", "4", "--log-every", "2", "--save-every", "4", "--ttt-steps", "2",
            "--token-budget", "1024", "--max-length", "192", "--lr", "1e-3",
        )
    )  # fmt: skip
    head = run / "head"
    head_cfg = json.loads((head / "config.json").read_text())
    assert head_cfg["attention_bias"] is False and head_cfg["hidden_act"] == "silu"
    assert head_cfg["eagle3"]["target_architectures"] == [fam.model_class]

    # export + serve preflight per engine: accepted, refused before launch, or warned about
    for engine, want in zip(("sglang", "vllm"), ENGINE_SUPPORT[name], strict=True):
        spec = ["--steps", "4", "--topk", "1", "--draft-tokens", "5"]  # a chain: both engines run it
        r = eagle3("serve", "--target", target, "--head", head, "--engine", engine, *spec, "--dry-run")
        out = " ".join((r.stdout + r.stderr).split())
        if want == "no":
            assert r.returncode == 2 and "cannot serve an EAGLE-3 head" in out and "Traceback" not in out, out[-2000:]
        else:
            assert r.returncode == 0 and "preflight passed" in out, out[-3000:]
            assert ("cannot tell whether" in out) == (want == "unknown")
    r = eagle3("export", "--head", head, "--format", "speculators", "--out", tmp_path / "spec")
    if ENGINE_SUPPORT[name][1] == "no":
        assert r.returncode == 2 and "vLLM cannot serve" in r.stderr + r.stdout
    else:
        _ok(r)
        spec = json.loads((tmp_path / "spec" / "config.json").read_text())
        assert spec["speculators_config"]["verifier"]["architectures"] == [fam.model_class]

    # eval: greedy, chain and tree, prompts past the window; exactly the target's tokens
    bench = tmp_path / "long.jsonl"
    bench.write_text(
        "".join(json.dumps({"id": f"long{i}", "prompt": f"{LONG} Question {i}?"}) + "\n" for i in range(2))
    )
    r = eagle3(
        "eval", "--run", run, "--target", target, "--bench", bench, "--num-prompts", "2", "--max-new-tokens", "40",
        "--mode", "both", "--depth", "4", "--topk", "2", "--num-draft-tokens", "6", "--threads", "1",
        "--no-generate-baseline", "--temperature", "0",
    )  # fmt: skip
    _ok(r)
    report = json.loads((run / "eval" / "report.json").read_text())
    for mode in ("chain", "tree"):
        (stats,) = [m[mode] for m in report["heads"].values()]
        assert stats["lossless"]["compared"] == 2 and stats["lossless"]["mismatches"] == 0, stats["lossless"]
