"""Speculative decoding on transformers (batch 1): EAGLE-3 chain or EAGLE-2 dynamic tree.

One round, with L tokens in the target's KV cache and `pending` the last emitted token:
  1. draft: D tokens (chain: D-1 chained draft calls after the root; tree: D-1 batched levels);
  2. verify: ONE target forward over [pending, drafted...] (tree: 4D ancestor mask + depth
     position ids), capturing the aux features of every input position;
  3. accept (greedy or lossless sampling), keep only the accepted path in the target cache
     (crop for a chain prefix; gather for a tree path), and write the draft's step-0 entries for
     the newly committed positions from the captured features (one draft call, whose last
     output is the root of the next round).
Alignment (as in training): the draft entry at position t pairs target feature t with token x[t+1].
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ..model.draft import Eagle3Draft
from ..model.target import AuxCapture
from ..speculate import (
    expand_frontier,
    logits_to_probs,
    sample,
    select_nodes,
    tree_attention_mask,
    tree_position_ids,
    verify_chain_greedy,
    verify_chain_sampling,
    verify_tree_greedy,
    verify_tree_sampling,
)


@dataclass
class DecodeResult:
    tokens: list[int]  # the new tokens (eos included if emitted)
    accept_lens: list[int] = field(default_factory=list)  # accepted draft tokens per verification round
    seconds: float = 0.0  # wall clock, prefill included
    target_calls: int = 0  # target forwards, prefill included
    draft_calls: int = 0

    @property
    def rounds(self) -> int:
        return len(self.accept_lens)


def eos_ids_of(model, tokenizer=None) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if e is None:
            continue
        ids.update([e] if isinstance(e, int) else list(e))
    return ids


def _finish(tokens: list[int], new: list[int], eos: set[int], max_new: int) -> bool:
    """Append `new` up to the first eos / the token budget; True when generation is over."""
    for t in new:
        tokens.append(int(t))
        if t in eos or len(tokens) >= max_new:
            return True
    return False


def _target_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    return model.lm_head(hidden)


@torch.inference_mode()
def plain_decode(
    model,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos: set[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """The baseline: the same KV-cache forward as the speculative decoder, one token per call."""
    dev = model.device
    start = time.perf_counter()
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt_ids], device=dev)
    tokens: list[int] = []
    calls = 0
    while True:
        h = model.model(input_ids=ids, cache=cache, use_cache=True).last_hidden_state[:, -1]
        calls += 1
        tok, _ = sample(_target_logits(model, h)[0], temperature, top_p, generator)
        if _finish(tokens, [int(tok)], eos, max_new_tokens):
            break
        ids = tok.view(1, 1).to(dev)
    return DecodeResult(tokens, seconds=time.perf_counter() - start, target_calls=calls)


@torch.inference_mode()
def hf_generate(model, prompt_ids: list[int], max_new_tokens: int, eos: set[int], pad_id: int | None) -> DecodeResult:
    """transformers' own greedy `generate`, for the reference speed and output."""
    ids = torch.tensor([prompt_ids], device=model.device)
    start = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos) or None,
        pad_token_id=pad_id,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    seconds = time.perf_counter() - start
    new = out[0, len(prompt_ids) :].tolist()
    tokens: list[int] = []
    _finish(tokens, new, eos, max_new_tokens)
    return DecodeResult(tokens, seconds=seconds, target_calls=len(tokens))


class DraftRunner:
    """Incremental draft calls for decoding: the maths of `Eagle3Draft.forward`, with a
    preallocated KV buffer (entries are written in place, never re-concatenated), a rope table
    computed once, GQA inside SDPA, and no mask at all for a chain step (one new entry that sees
    every existing one). Committed entries come first; speculative ones follow and are dropped
    by moving `length` back."""

    def __init__(self, draft: Eagle3Draft, max_len: int, device):
        attn = draft.midlayer.self_attn
        self.d = draft
        self.dtype = next(draft.parameters()).dtype
        self.nh, self.nkv, self.hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.k = torch.zeros(1, self.nkv, max_len, self.hd, dtype=self.dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = self.committed = 0
        cos, sin = draft.rotary_emb(self.k, torch.arange(max_len, device=device).unsqueeze(0))
        self.cos, self.sin = cos[0], sin[0]  # [max_len, head_dim]
        self.scale = 1.0 / math.sqrt(self.hd)

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def commit(self) -> None:
        self.committed = self.length

    def step(
        self,
        token_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        from_target: bool,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append n entries (token_ids [n], hidden [1,n,*], positions [n]); returns their output
        hidden states [1,n,H]. `mask` [n, length + n] says what each sees; None = all existing
        entries, causal among the new ones."""
        d = self.d
        layer, attn = d.midlayer, d.midlayer.self_attn
        n = token_ids.shape[0]
        if from_target:
            hidden = d.fc(hidden.to(self.dtype))
        x = layer.attn_input(d.embed_tokens.weight[token_ids].unsqueeze(0).to(self.dtype), hidden)
        q = attn.q_proj(x).view(1, n, self.nh, self.hd).transpose(1, 2)
        k = attn.k_proj(x).view(1, n, self.nkv, self.hd).transpose(1, 2)
        v = attn.v_proj(x).view(1, n, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, self.cos[positions].unsqueeze(0), self.sin[positions].unsqueeze(0))
        s = self.length
        if s + n > self.k.shape[2]:
            raise RuntimeError(f"draft KV buffer of {self.k.shape[2]} entries overflowed")
        self.k[:, :, s : s + n] = k
        self.v[:, :, s : s + n] = v
        self.length = s + n
        if mask is None and n > 1:
            mask = torch.ones(n, s + n, dtype=torch.bool, device=x.device)
            mask[:, s:] = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        out = F.scaled_dot_product_attention(
            q,
            self.k[:, :, : s + n],
            self.v[:, :, : s + n],
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=self.nh != self.nkv,
        )
        return layer.finish(hidden, out)


class SpeculativeDecoder:
    """Greedy (temperature 0) or lossless-sampling speculative decoding with one EAGLE-3 head."""

    def __init__(
        self,
        target,
        draft: Eagle3Draft,
        aux_layer_ids: tuple[int, ...],
        *,
        mode: str = "chain",
        depth: int = 8,
        topk: int = 4,
        num_draft_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        eos: set[int] | None = None,
    ):
        self.target, self.draft = target, draft
        self.aux_ids = tuple(aux_layer_ids)
        self.mode, self.depth, self.topk, self.num_draft_tokens = mode, depth, topk, num_draft_tokens
        self.temperature, self.top_p = temperature, top_p
        self.eos = set(eos or ())
        self.device = target.device
        self.vocab = target.config.vocab_size
        self.draft_to_target_ids = draft.draft_to_target(
            torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device)
        ).to(self.device)
        # 4D masks: sdpa takes bool (True = attend), eager adds a float mask
        self.bool_mask = getattr(target.config, "_attn_implementation", "sdpa") != "eager"

    # ------------------------------------------------------------------ target
    def _target(self, ids: torch.Tensor, cache, cap: AuxCapture, position_ids=None, attention_mask=None):
        out = self.target.model(
            input_ids=ids, cache=cache, use_cache=True, position_ids=position_ids, attention_mask=attention_mask
        )
        self.result.target_calls += 1
        return _target_logits(self.target, out.last_hidden_state)[0], cap.concat()[0]

    # ------------------------------------------------------------------ draft
    def _commit(self, dr, tokens: torch.Tensor, aux: torch.Tensor, first_pos: int) -> torch.Tensor:
        """Step-0 entries for newly committed positions; returns the last entry's output [1,1,H]."""
        dr.crop(dr.committed)
        n = tokens.shape[0]
        out = dr.step(
            tokens, aux.unsqueeze(0), torch.arange(first_pos, first_pos + n, device=self.device), from_target=True
        )
        self.result.draft_calls += 1
        dr.commit()
        return out[:, -1:]

    def _draft_step(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, position: int, dr, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """n new entries at one rope position, each seeing exactly `mask` [n, length + n]
        (None: a chain step, which sees everything). Tree levels need the mask: siblings must
        not see each other."""
        self.result.draft_calls += 1
        pos = torch.full((token_ids.shape[0],), position, device=self.device, dtype=torch.long)
        return dr.step(token_ids, hidden, pos, from_target=False, mask=mask)

    def _pick(self, logits: torch.Tensor):
        """(draft id, its probs over the draft vocab or None when greedy)."""
        if self.temperature <= 0:
            return logits.argmax(-1), None
        tok, probs = sample(logits, self.temperature, self.top_p, self.generator)
        return tok, probs

    # ------------------------------------------------------------------ decoding
    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int = 0) -> DecodeResult:
        self.result = res = DecodeResult([])
        self.generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        cache = DynamicCache(config=self.target.config)
        room = len(prompt_ids) + max_new_tokens + self.depth * max(self.topk, 1) + 2
        make = getattr(self.draft, "make_runner", None)  # test stubs bring their own
        dcache = make(room) if make else DraftRunner(self.draft, room, self.device)
        with AuxCapture(self.target, self.aux_ids) as cap:
            ids = torch.tensor([prompt_ids], device=self.device)
            logits, aux = self._target(ids, cache, cap)
            pending, _ = sample(logits[-1], self.temperature, self.top_p, self.generator)
            done = _finish(res.tokens, [int(pending)], self.eos, max_new_tokens)
            n = len(prompt_ids)
            root = self._commit(dcache, torch.cat([ids[0, 1:], pending.view(1)]), aux, 0)
            length = n  # tokens in the target cache; `pending` goes at this position
            while not done:
                round_fn = self._chain_round if self.mode == "chain" else self._tree_round
                emitted, aux_rows, accept_len = round_fn(pending, root, length, cache, dcache, cap)
                res.accept_lens.append(accept_len)
                done = _finish(res.tokens, emitted.tolist(), self.eos, max_new_tokens)
                if done:
                    break
                root = self._commit(dcache, emitted.to(self.device), aux_rows, length)
                length += accept_len + 1
                pending = emitted[-1]
        res.seconds = time.perf_counter() - start
        return res

    def _chain_round(self, pending, root, length, cache, dcache, cap):
        d = self.depth
        h = root
        drafted, qs = [], []
        for k in range(d):
            tok, q = self._pick(self.draft.logits(h)[0, -1])
            tok_t = self.draft_to_target_ids[tok]
            drafted.append(tok_t)
            qs.append(q)
            if k < d - 1:
                h = self._draft_step(tok_t.view(1), h, length + k, dcache)
        drafted_t = torch.stack(drafted)
        ids = torch.cat([pending.view(1).to(self.device), drafted_t]).view(1, -1)
        logits, aux = self._target(ids, cache, cap)
        if self.temperature <= 0:
            a, emitted = verify_chain_greedy(drafted_t, logits)
        else:
            qt = torch.zeros(d, self.vocab, dtype=torch.float32)
            qt[:, self.draft_to_target_ids.cpu()] = torch.stack(qs).float()
            p = logits_to_probs(logits, self.temperature, self.top_p)
            a, emitted = verify_chain_sampling(drafted_t.cpu(), qt, p.cpu(), self.generator)
        if d - a > 0:
            cache.crop(-(d - a))
        return emitted, aux[: a + 1], a

    def _tree_round(self, pending, root, length, cache, dcache, cap):
        k, dev = self.topk, self.device
        committed = dcache.committed
        lp = torch.log_softmax(self.draft.logits(root)[0, -1].float(), -1)
        sc, tok = lp.topk(min(k, lp.shape[-1]))
        cand_tok, cand_par, cand_sc = [tok], [torch.full_like(tok, -1)], [sc]
        cand_hidden = [root[0].expand(tok.shape[0], -1)]  # hidden input of each candidate's entry
        frontier = torch.arange(tok.shape[0])
        entry_of: dict[int, int] = {}  # candidate index -> its draft-cache entry
        ancestors: dict[int, list[int]] = {}
        n_cand = tok.shape[0]
        all_par = cand_par[0].tolist()
        for level in range(1, self.depth):
            toks_all, hid_all = torch.cat(cand_tok), torch.cat(cand_hidden)
            fr = frontier.tolist()
            s_old = dcache.length
            rows_i, cols_i = [], []
            for j, c in enumerate(fr):
                par = all_par[c]
                anc = ancestors.get(par, []) + ([entry_of[par]] if par != -1 else [])  # entries of ancestors
                ancestors[c] = anc
                entry_of[c] = s_old + j
                cols_i += anc + [s_old + j]
                rows_i += [j] * (len(anc) + 1)
            mask = torch.zeros(len(fr), s_old + len(fr), dtype=torch.bool, device=dev)
            mask[:, :committed] = True
            mask[torch.tensor(rows_i, device=dev), torch.tensor(cols_i, device=dev)] = True
            out = self._draft_step(
                self.draft_to_target_ids[toks_all[frontier]],
                hid_all[frontier].unsqueeze(0),
                length - 1 + level,
                dcache,
                mask,
            )
            lp = torch.log_softmax(self.draft.logits(out)[0].float(), -1)
            scores_all = torch.cat(cand_sc)
            sc, tok, slot = expand_frontier(scores_all[frontier], lp, min(k, lp.shape[-1]))
            parents = frontier[slot]
            cand_tok.append(tok)
            cand_par.append(parents)
            cand_sc.append(sc)
            cand_hidden.append(out[0][slot])
            all_par += parents.tolist()
            frontier = n_cand + sc.topk(min(k, sc.shape[0])).indices
            n_cand += tok.shape[0]
        # SGLang counts the root among the verified tokens: num_draft_tokens - 1 tree nodes
        tree = select_nodes(torch.cat(cand_tok), torch.cat(cand_par), torch.cat(cand_sc), self.num_draft_tokens - 1)
        tree_tokens = self.draft_to_target_ids[tree.tokens]
        n = len(tree)
        ids = torch.cat([pending.view(1).to(dev), tree_tokens]).view(1, -1)
        pos = tree_position_ids(tree.depths, length).to(dev).unsqueeze(0)
        m = torch.ones(n + 1, length + n + 1, dtype=torch.bool, device=dev)
        m[:, length:] = tree_attention_mask(tree.parents).to(dev)
        if not self.bool_mask:
            m = torch.zeros(m.shape, dtype=self.target.dtype, device=dev).masked_fill(
                ~m, torch.finfo(self.target.dtype).min
            )
        logits, aux = self._target(ids, cache, cap, position_ids=pos, attention_mask=m[None, None])
        if self.temperature <= 0:
            path, emitted = verify_tree_greedy(tree_tokens.cpu(), tree.parents, logits)
        else:
            p = logits_to_probs(logits, self.temperature, self.top_p).cpu()
            path, emitted = verify_tree_sampling(tree_tokens.cpu(), tree.parents, p, self.generator)
        a = len(path)
        rows = torch.tensor([0] + [i + 1 for i in path], device=dev)
        if path == list(range(a)):
            if n - a > 0:
                cache.crop(-(n - a))
        else:
            keep = torch.cat([torch.arange(length, device=dev), length + rows])
            for layer in cache.layers:
                layer.keys = layer.keys.index_select(2, keep)
                layer.values = layer.values.index_select(2, keep)
        return emitted, aux.index_select(0, rows), a
