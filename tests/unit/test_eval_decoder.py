"""The speculative decoder on transformers: greedy output identical to `generate`, stub drafts
giving tau = D+1 / 1, tree verification logits equal per-path decoding, lossless sampling.

`OracleDraft` knows the target's greedy continuation and agrees always / never / at chosen
positions (with the right token as its k-th choice, so trees accept through later siblings and
exercise the cache gather)."""

from __future__ import annotations

import os

import pytest
import torch
from test_speculate import chi_square_pvalue  # tests/unit is on sys.path under pytest
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3cli.eval.decoder import DraftRunner, SpeculativeDecoder, eos_ids_of, hf_generate, plain_decode
from eagle3cli.model.draft import DraftCache, Eagle3Draft, draft_config_from_target
from eagle3cli.model.target import default_aux_layer_ids, load_target
from eagle3cli.speculate import tree_attention_mask, tree_position_ids


class OracleDraft(nn.Module):
    """Entry at position t (token x[t+1]) proposes for x[t+2]. Its hidden state carries t.

    `rank(t)` says where the true token sits among the draft's choices at t: 0 = top choice,
    r > 0 = after r wrong tokens, None = nowhere in the top ones (never agrees).
    """

    def __init__(self, sequence: list[int], vocab_size: int, rank=lambda t: 0):
        super().__init__()
        self.seq = sequence
        self.vocab = vocab_size
        self.rank = rank
        self.config = type("Cfg", (), {"draft_vocab_size": vocab_size})()
        self.register_buffer("d2t", torch.zeros(vocab_size, dtype=torch.long))
        self.dummy = nn.Parameter(torch.zeros(1))

    def draft_to_target(self, ids):
        return ids + self.d2t[ids]

    def make_runner(self, room: int):
        return _OracleRunner()

    def logits(self, h):
        pos = h[..., 0].long()
        out = torch.zeros(*pos.shape, self.vocab)
        for idx in torch.cartesian_prod(*[torch.arange(s) for s in pos.shape]).view(-1, pos.dim()):
            t = int(pos[tuple(idx)])
            want = self.seq[t + 2] if t + 2 < len(self.seq) else 0
            r = self.rank(t)
            row = out[tuple(idx)]
            # wrong tokens first (distinct from `want`), each a bit less likely than the last
            wrong = [w for w in range(self.vocab) if w != want][:8]
            for j, w in enumerate(wrong):
                row[w] = 20.0 - j
            row[want] = -1e4 if r is None else (40.0 if r == 0 else 20.0 - r + 0.5)
        return out


class _OracleRunner:
    """The decoder's draft-runner interface; an entry's output is its position."""

    def __init__(self):
        self.length = self.committed = 0

    def crop(self, length):
        self.length = min(self.length, length)

    def commit(self):
        self.committed = self.length

    def step(self, token_ids, hidden, positions, from_target, mask=None):
        self.length += token_ids.shape[0]
        return positions.float().view(1, -1, 1)


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


def test_draft_runner_matches_eagle3_forward(tiny):
    """The decoder's lean draft path (KV buffer, rope table, GQA in SDPA) computes exactly what
    Eagle3Draft.forward does: committed step-0 entries, chained steps, and a batched tree level
    whose siblings do not see each other."""
    model, _tok, _ = tiny
    d, aux = random_draft(model)
    feats = torch.randn(1, 6, len(aux) * model.config.hidden_size)
    toks = torch.arange(1, 7)
    with torch.no_grad():
        ref_cache = DraftCache()
        ref = d(toks.view(1, 6), feats, torch.arange(6).view(1, 6), ref_cache, from_target=True)
        ref_cache.commit()
        run = DraftRunner(d, 32, torch.device("cpu"))
        got = run.step(toks, feats, torch.arange(6), from_target=True)
        run.commit()
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        h_ref, h_got = ref[:, -1:], got[:, -1:]
        for i, t in enumerate([9, 4, 7]):  # a chain
            h_ref = d(torch.tensor([[t]]), h_ref, torch.tensor([[6 + i]]), ref_cache, from_target=False)
            h_got = run.step(torch.tensor([t]), h_got, torch.tensor([6 + i]), from_target=False)
            torch.testing.assert_close(h_got, h_ref, atol=1e-5, rtol=1e-5)
        run.crop(run.committed)
        root = got[:, -1:]
        mask = torch.ones(3, 9, dtype=torch.bool)
        mask[:, 6:] = torch.eye(3, dtype=torch.bool)
        batched = run.step(torch.tensor([5, 8, 13]), root.expand(1, 3, -1), torch.full((3,), 6), False, mask)
        for j, t in enumerate([5, 8, 13]):
            cache = DraftCache(ref_cache.k[:, :, :6].clone(), ref_cache.v[:, :, :6].clone(), 6)
            alone = d(torch.tensor([[t]]), root, torch.tensor([[6]]), cache, from_target=False)
            torch.testing.assert_close(batched[0, j], alone[0, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_sampled_outputs_follow_target_distribution(mode):
    """Small vocab, many draws: (t1, t2, t3) from speculative sampling vs the exact target
    probabilities enumerated from the model (chi-square). t1 comes from the prefill, t2/t3
    from a speculation round that accepts, rejects and adds bonus tokens."""
    v = 5
    torch.manual_seed(3)
    cfg = LlamaConfig(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
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
    assert 2 in eos_ids_of(model, tok)
