"""The speculative decoder on transformers: greedy output identical to `generate`, stub drafts
giving tau = D+1 / 1, tree verification logits equal per-path decoding, lossless sampling.

`OracleDraft` (draft_stubs.py) knows the target's greedy continuation and agrees always / never
/ at chosen positions (with the right token as its k-th choice, so trees accept through later
siblings and move the accepted path inside the KV cache)."""

from __future__ import annotations

import os

import pytest
import torch
from chi_square import chi_square_pvalue
from draft_stubs import OracleDraft
from tiny_configs import tiny_llama_config
from transformers import LlamaForCausalLM

from eagle3cli.model.target import load_target
from eagle3cli.speculate import tree_attention_mask, tree_position_ids
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.decoder import SpeculativeDecoder, hf_generate, plain_decode
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.target import eos_token_ids

PROMPTS = [
    "What is 12 times 7?",
    "Write a haiku about rain.",
    "Explain recursion briefly.",
    "List three colours.",
    "Translate 'good morning' to French.",
    "Why is the sky blue?",
]


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    model, tok, _ = load_target(tiny_target_dir)
    prompts = []
    for text in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return model, tok, prompts


def random_draft(model, seed=0, draft_vocab=None):
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    v = draft_vocab or model.config.vocab_size
    torch.manual_seed(seed)
    d = Eagle3Draft(draft_config_from_target(model.config, v, aux)).eval()
    with torch.no_grad():
        d.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        if v < model.config.vocab_size:  # draft id i -> target id 2i + 1
            d.set_vocab_maps(torch.arange(v) + 1, torch.zeros(model.config.vocab_size, dtype=torch.bool))
    return d, aux


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_greedy_equals_generate(tiny, mode):
    """Random head (rarely right) and an oracle head right at varying ranks (trees then accept
    through later siblings, so the KV cache is gathered, not only cropped)."""
    model, _tok, prompts = tiny
    n_new = 20
    for i, prompt in enumerate(prompts):
        ref = hf_generate(model, prompt, n_new, set(), 0)
        assert plain_decode(model, prompt, n_new, set()).tokens == ref.tokens
        d, aux = random_draft(model, seed=i, draft_vocab=512 if i % 2 else None)
        oracle = OracleDraft(prompt + ref.tokens, model.config.vocab_size, rank=lambda t: (t * 7) % 4 or None)
        for draft in (d, oracle):
            dec = SpeculativeDecoder(model, draft, aux, mode=mode, depth=4, topk=3, num_draft_tokens=8)
            out = dec.generate(prompt, n_new)
            assert out.tokens == ref.tokens, (mode, i, type(draft).__name__)
            assert sum(out.accept_lens) + out.rounds >= len(out.tokens) - 1


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_stub_drafts_always_and_never(tiny, mode):
    model, _tok, prompts = tiny
    prompt, depth, n_new = prompts[0], 5, 25
    ref = plain_decode(model, prompt, n_new, set())
    seq = prompt + ref.tokens
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    always = SpeculativeDecoder(
        model, OracleDraft(seq, model.config.vocab_size), aux, mode=mode, depth=depth, topk=2, num_draft_tokens=12
    ).generate(prompt, n_new)
    never = SpeculativeDecoder(
        model,
        OracleDraft(seq, model.config.vocab_size, rank=lambda t: None),
        aux,
        mode=mode,
        depth=depth,
        topk=2,
        num_draft_tokens=12,
    ).generate(prompt, n_new)
    assert always.tokens == ref.tokens == never.tokens
    # the last round may be cut by the token budget; every full round accepts all D
    assert always.accept_lens[:-1] == [depth] * (always.rounds - 1)
    assert set(never.accept_lens) == {0} and never.rounds == n_new - 1


def test_tree_verification_logits_equal_per_path_decoding(tiny):
    """One forward with the 4D ancestor mask and depth positions gives, at every node, the logits
    of decoding that node's path as a plain sequence."""
    from transformers import DynamicCache

    model, _tok, prompts = tiny
    prefix = prompts[1]
    parents = torch.tensor([-1, -1, 0, 0, 1, 2, 2])
    tokens = torch.tensor([11, 22, 33, 44, 55, 66, 77])
    depths = torch.tensor([1, 1, 2, 2, 2, 3, 3])
    root = 99
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([prefix[:-1]]), cache=cache, use_cache=True)
        n0 = len(prefix) - 1
        mask = torch.ones(8, n0 + 8, dtype=torch.bool)
        mask[:, n0:] = tree_attention_mask(parents)
        ids = torch.cat([torch.tensor([root]), tokens]).view(1, -1)
        pos = tree_position_ids(depths, n0).view(1, -1)
        tree_logits = model(input_ids=ids, cache=cache, position_ids=pos, attention_mask=mask[None, None]).logits[0]
        for i in range(7):
            path, j = [], i
            while j != -1:
                path.append(int(tokens[j]))
                j = int(parents[j])
            seq = prefix[:-1] + [root] + path[::-1]
            ref = model(input_ids=torch.tensor([seq])).logits[0, -1]
            torch.testing.assert_close(tree_logits[i + 1], ref, atol=1e-4, rtol=1e-4)


def test_batched_tree_level_equals_each_sibling_alone(tiny):
    """The draft step the decoder runs for one tree level (k siblings in scratch slots, one shared
    position, an explicit mask) gives each sibling exactly what running it alone after the
    committed entries gives; `last_only` commits give the last entry's full output."""
    model, _tok, _ = tiny
    d, aux = random_draft(model)
    feats = torch.randn(1, 6, len(aux) * model.config.hidden_size)
    toks = torch.arange(1, 7).view(1, 6)
    with torch.no_grad():
        cache = d.new_cache(16)
        full = d(toks, feats, cache, 0, from_target=True)
        last = d(toks, feats, d.new_cache(16), 0, from_target=True, last_only=True)
        torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=1e-5)
        root = full[:, -1:]
        # two earlier siblings sit in scratch slots 6, 7; the level's entries go to slots 8..10
        d(torch.tensor([[3, 4]]), root.expand(1, 2, -1), cache, 6, from_target=False, position=6)
        mask = torch.zeros(3, 11, dtype=torch.bool)
        mask[:, :6] = True
        mask[:, 8:] = torch.eye(3, dtype=torch.bool)
        batched = d(torch.tensor([[5, 8, 13]]), root.expand(1, 3, -1), cache, 8, False, position=6, mask=mask)
        for j, t in enumerate([5, 8, 13]):
            alone_cache = d.new_cache(16)
            d(toks, feats, alone_cache, 0, from_target=True)
            alone = d(torch.tensor([[t]]), root, alone_cache, 6, from_target=False)
            torch.testing.assert_close(batched[0, j], alone[0, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_sampled_outputs_follow_target_distribution(mode):
    """Small vocab, many draws: (t1, t2, t3) from speculative sampling vs the exact target
    probabilities enumerated from the model (chi-square). t1 comes from the prefill, t2/t3
    from a speculation round that accepts, rejects and adds bonus tokens."""
    v = 5
    torch.manual_seed(3)
    cfg = tiny_llama_config(v, layers=4, max_positions=64)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # peaky rows: a few hundred draws fill the likely cells
    d, aux = random_draft(model, seed=4)
    prompt = [1, 3, 0, 2]
    temp = 1.0
    with torch.no_grad():
        seqs = torch.cartesian_prod(*[torch.arange(v)] * 3)
        full = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], 1)
        logp = torch.log_softmax(model(input_ids=full).logits / temp, -1)
        n = len(prompt)
        exact = sum(logp[torch.arange(len(seqs)), n - 1 + j, seqs[:, j]] for j in range(3)).exp()
    assert abs(float(exact.sum()) - 1) < 1e-4
    dec = SpeculativeDecoder(model, d, aux, mode=mode, depth=2, topk=2, num_draft_tokens=3, temperature=temp)
    counts = torch.zeros(len(seqs))
    draws, accepted = int(os.environ.get("EAGLE3_TEST_DRAWS", 600)), 0
    for s in range(draws):
        out = dec.generate(prompt, 3, seed=s)
        a, b, c = out.tokens
        counts[a * v * v + b * v + c] += 1
        accepted += sum(out.accept_lens)
    assert accepted > 0  # the draft is sometimes right, so acceptance paths are exercised
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_eos_stops_decoding(tiny):
    model, tok, prompts = tiny
    ref = plain_decode(model, prompts[2], 12, set())
    stop = {ref.tokens[5]}
    d, aux = random_draft(model)
    seq = prompts[2] + ref.tokens
    for mode in ("chain", "tree"):
        out = SpeculativeDecoder(
            model,
            OracleDraft(seq, model.config.vocab_size),
            aux,
            mode=mode,
            depth=4,
            topk=2,
            num_draft_tokens=8,
            eos=stop,
        ).generate(prompts[2], 12)
        first = ref.tokens.index(ref.tokens[5])
        assert out.tokens == ref.tokens[: first + 1]
    assert 2 in eos_token_ids(model, tok)
