"""Train the small target model that every eagle3 quality number is measured on.

No real LLM can be downloaded on our CI machines, so the project trains its own: a byte-level
BPE tokenizer with a ChatML chat template, and a deep, narrow Llama (12 layers) on
chat-formatted GSM8K train conversations, the ShareGPT-format sample conversations, and
Python standard-library source. Deterministic for a given seed and thread count.

    .venv/bin/python tools/train_tiny_target.py --config recipes/tiny-target/tiny-target.yaml
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[1]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SYSTEM_PROMPT = "You are a helpful assistant. Solve the problem step by step."
# ChatML, as Qwen uses it: the assistant turn ends with <|im_end|>, which is also EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def gsm8k_conversations(path: Path, rng: random.Random) -> list[list[dict]]:
    convs = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        msgs = [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": row["answer"]}]
        if rng.random() < 0.5:  # half with a system turn, so the template's system path is learnt
            msgs.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        convs.append(msgs)
    return convs


def sharegpt_conversations(path: Path) -> list[list[dict]]:
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    return [
        [{"role": roles[t["from"]], "content": t["value"]} for t in row["conversations"]]
        for row in json.loads(path.read_text())
    ]


def code_documents(max_chars: int) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for f in sorted(stdlib.glob("*.py")):  # top level only: stable across installs
        text = f.read_text(errors="ignore")
        if len(text) > 60_000:
            text = text[:60_000]
        docs.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return docs


def render(msgs: list[dict]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=2048,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def pack(token_docs: list[list[int]], seq_len: int, sep: int) -> torch.Tensor:
    flat: list[int] = []
    for d in token_docs:
        flat.extend(d)
        flat.append(sep)
    n = len(flat) // seq_len
    return torch.tensor(flat[: n * seq_len], dtype=torch.long).view(n, seq_len)


@torch.no_grad()
def heldout_loss(model, tok, convs: list[list[dict]]) -> tuple[float, float]:
    """Mean NLL per token over assistant answer tokens, and over all tokens."""
    model.eval()
    a_sum = a_n = t_sum = t_n = 0.0
    for msgs in convs:
        prompt = tok.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
        full = render(msgs)
        n_prompt = len(tok(prompt)["input_ids"])
        ids = torch.tensor([tok(full)["input_ids"]])
        logits = model(input_ids=ids).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        a_sum += nll[n_prompt - 1 :].sum().item()
        a_n += nll[n_prompt - 1 :].numel()
        t_sum += nll.sum().item()
        t_n += nll.numel()
    model.train()
    return a_sum / a_n, t_sum / t_n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "recipes/tiny-target/tiny-target.yaml"))
    ap.add_argument("--out-dir", default=None, help="override out_dir from the config")
    ap.add_argument("--steps", type=int, default=None, help="override steps (smoke runs)")
    args = ap.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    if args.steps is not None:
        cfg["steps"] = args.steps
    out = Path(args.out_dir or REPO / cfg["out_dir"])
    from eagle3cli.readers.sources import bundled  # the data shipped in the package, with its licences

    torch.set_num_threads(cfg.get("threads", 2))
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    t0 = time.time()

    convs = gsm8k_conversations(bundled("gsm8k_train.jsonl"), rng) + sharegpt_conversations(
        bundled("sharegpt_sample.json")
    )
    chats = [render(c) for c in convs]
    code = code_documents(cfg["code_chars"])
    tok = train_tokenizer(chats + code, cfg["vocab_size"])
    print(f"tokenizer: {len(tok)} tokens ({time.time() - t0:.0f}s)", flush=True)

    docs = [tok(t)["input_ids"] for t in chats + code]
    rng.shuffle(docs)
    seqs = pack(docs, cfg["seq_len"], tok.convert_tokens_to_ids("<|endoftext|>"))
    print(f"corpus: {seqs.numel():,} tokens in {len(seqs)} sequences of {cfg['seq_len']}", flush=True)

    mcfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        max_position_embeddings=cfg["max_position_embeddings"],
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(mcfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, {mcfg.num_hidden_layers} layers", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["lr"],
        betas=(0.9, 0.95),
    )
    steps, warm = cfg["steps"], cfg["warmup_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(cfg["seed"]))
    bs = cfg["batch_size"]
    t_train = time.time()
    for step in range(steps):
        idx = order[(torch.arange(bs) + step * bs) % len(seqs)]
        batch = seqs[idx]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.get("autocast_bf16", False))):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == steps - 1:
            el = time.time() - t_train
            print(
                f"step {step:4d}/{steps} loss {loss.item():.3f} lr {sched.get_last_lr()[0]:.2e} "
                f"{(step + 1) * bs * cfg['seq_len'] / el:,.0f} tok/s",
                flush=True,
            )

    test = [json.loads(x) for x in (bundled("gsm8k_test.jsonl")).read_text().splitlines()][: cfg["heldout_samples"]]
    test_convs = [
        [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}] for r in test
    ]
    a_loss, t_loss = heldout_loss(model, tok, test_convs)
    elapsed = time.time() - t0
    print(f"held-out GSM8K test loss: {a_loss:.3f} nats/token on answers, {t_loss:.3f} on all tokens", flush=True)

    q = test[0]["question"]
    prompt = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    model.eval()
    with torch.no_grad():
        gen = model.generate(
            ids, max_new_tokens=160, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        )
    answer = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
    print(f"Q: {q}\nA: {answer}", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        do_sample=False,
        max_new_tokens=256,
    )
    # bf16 on disk halves the size (the 16 MB budget); eagle3 upcasts to fp32 on CPU.
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    stats = {
        "seed": cfg["seed"],
        "threads": torch.get_num_threads(),
        "parameters": n_params,
        "layers": mcfg.num_hidden_layers,
        "hidden_size": mcfg.hidden_size,
        "vocab_size": len(tok),
        "train_tokens": steps * bs * cfg["seq_len"],
        "heldout_gsm8k_answer_loss": round(a_loss, 4),
        "heldout_gsm8k_all_token_loss": round(t_loss, 4),
        "heldout_samples": len(test_convs),
        "train_seconds": round(elapsed, 1),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "sample_question": q,
        "sample_answer_greedy": answer,
    }
    (out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps({k: v for k, v in stats.items() if not k.startswith("sample")}), flush=True)


if __name__ == "__main__":
    main()
