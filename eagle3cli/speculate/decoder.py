"""Speculative decoding on transformers (batch 1): EAGLE-3 chain or EAGLE-2 dynamic tree.

One round, with L tokens in the target's KV cache and `pending` the last emitted token:
  1. draft: D tokens (chain: D-1 chained draft steps after the root; tree: D-1 batched levels);
  2. verify: ONE target forward over [pending, drafted...] (tree: ancestor mask + depth
     position ids), capturing the aux features of every input position;
  3. accept (greedy or lossless sampling): in a chain, the round's one host sync. Both KV caches are
     position-indexed (`TargetKV`, `DraftCache`), so a rejected suffix is simply overwritten
     next round; a tree's accepted path is moved into place. One draft step then writes the
     step-0 entries of the newly committed positions from the captured features; its last
     output is the root of the next round.
Alignment (as in training): the draft entry at position t pairs target feature t with token x[t+1].
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import (
    expand_frontier,
    generator_for,
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
from .target import AuxCapture, target_logits
from .target_kv import TargetKV


@dataclass
class DecodeResult:
    tokens: list[int]  # the new tokens (eos included if emitted)
    accept_lens: list[int] = field(default_factory=list)  # accepted draft tokens per verification round
    seconds: float = 0.0  # wall clock, prefill included
    prefill_seconds: float = 0.0  # the prompt's forward and first token (speculative: and its draft entries)
    target_calls: int = 0  # target forwards, prefill included
    draft_calls: int = 0

    @property
    def rounds(self) -> int:
        return len(self.accept_lens)


def _finish(tokens: list[int], new: list[int], eos: set[int], max_new: int) -> bool:
    """Append `new` up to the first eos / the token budget; True when generation is over."""
    for t in new:
        tokens.append(int(t))
        if t in eos or len(tokens) >= max_new:
            return True
    return False


def target_forward(model, kv: TargetKV, ids: torch.Tensor, start: int, positions=None, visible=None) -> torch.Tensor:
    """The target's last hidden states [n, H] for ids [1, n] written at KV slots [start, start+n)
    (the one target call of the decoder; benchmarks/stages time it by this name, and the logits by
    `target_logits`, this module's one way from hidden states to logits, softcapping included)."""
    return kv.run(model, ids, start, positions, visible)


@torch.inference_mode()
def plain_decode(
    model,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos: set[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> DecodeResult:
    """The baseline: the same KV cache and target forward as the speculative decoder, one token
    per call (logits of the last position only); sampled with a generator on the model's device."""
    dev = model.device
    generator = generator_for(dev, seed)
    start = time.perf_counter()
    kv = TargetKV(model, len(prompt_ids) + max_new_tokens + 1)
    ids = torch.tensor([prompt_ids], device=dev)
    tokens: list[int] = []
    calls = written = 0
    while True:
        h = target_forward(model, kv, ids, written)[-1:]
        calls += 1
        written += ids.shape[1]
        tok, _ = sample(target_logits(model, h)[0], temperature, top_p, generator)
        done = _finish(tokens, [int(tok)], eos, max_new_tokens)
        if calls == 1:
            prefill = time.perf_counter() - start
        if done:
            break
        ids = tok.view(1, 1).to(dev)
    return DecodeResult(tokens, seconds=time.perf_counter() - start, prefill_seconds=prefill, target_calls=calls)


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


@dataclass
class _Session:
    """One `generate` call's state, passed explicitly through its rounds (the decoder object holds
    settings only): both KV caches, the aux capture, the counts being filled, the sampler's generator."""

    kv: TargetKV
    dcache: Any  # the draft's DraftCache
    cap: AuxCapture
    result: DecodeResult
    generator: torch.Generator


class SpeculativeDecoder:
    """Greedy (temperature 0) or lossless-sampling speculative decoding with one EAGLE-3 head.

    The draft is anything with the `Eagle3Draft` decoding interface: `new_cache(max_len)`,
    `forward(input_ids, hidden, cache, start, from_target, position=, mask=, last_only=)`,
    `logits(hidden)`, `draft_to_target(ids)` and `config.draft_vocab_size`.
    """

    def __init__(
        self,
        target,
        draft,
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
        if mode not in ("chain", "tree"):
            raise ValueError(f"mode must be chain or tree, got {mode!r}")
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

    # ------------------------------------------------------------------ target
    def _target(self, s: _Session, ids: torch.Tensor, start: int, positions=None, visible=None):
        """(last hidden states [n, H], aux features [n, n_aux*H]) of ids [1, n] at slots start.."""
        hidden = target_forward(self.target, s.kv, ids, start, positions, visible)
        s.result.target_calls += 1
        return hidden, s.cap.concat()[0]

    # ------------------------------------------------------------------ draft
    def commit(self, s: _Session, tokens: torch.Tensor, aux: torch.Tensor, first_pos: int) -> torch.Tensor:
        """Step-0 entries for newly committed positions; returns the last entry's output [1,1,H]."""
        s.result.draft_calls += 1
        return self.draft(tokens.view(1, -1), aux.unsqueeze(0), s.dcache, first_pos, from_target=True, last_only=True)

    def pick(self, s: _Session, logits: torch.Tensor):
        """(draft id, its probs over the draft vocab or None when greedy)."""
        if self.temperature <= 0:
            return logits.argmax(-1), None
        return sample(logits, self.temperature, self.top_p, s.generator)

    # ------------------------------------------------------------------ decoding
    def _room(self, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
        """KV slots the target and the draft need: committed tokens plus one round's scratch."""
        verify = self.depth + 1 if self.mode == "chain" else self.num_draft_tokens
        draft_scratch = self.depth if self.mode == "chain" else self.depth * max(self.topk, 1)
        return prompt_len + max_new_tokens + verify + 1, prompt_len + max_new_tokens + draft_scratch + 1

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int = 0) -> DecodeResult:
        res = DecodeResult([])
        start = time.perf_counter()
        target_room, draft_room = self._room(len(prompt_ids), max_new_tokens)
        round_fn = self._chain_round if self.mode == "chain" else self._tree_round
        with AuxCapture(self.target, self.aux_ids) as cap:
            s = _Session(
                TargetKV(self.target, target_room),
                self.draft.new_cache(draft_room),
                cap,
                res,
                generator_for(self.device, seed),  # every draw is on the device of what it samples
            )
            ids = torch.tensor([prompt_ids], device=self.device)
            hidden, aux = self._target(s, ids, 0)
            pending, _ = sample(target_logits(self.target, hidden[-1:])[0], self.temperature, self.top_p, s.generator)
            done = _finish(res.tokens, [int(pending)], self.eos, max_new_tokens)
            root = self.commit(s, torch.cat([ids[0, 1:], pending.view(1)]), aux, 0)
            res.prefill_seconds = time.perf_counter() - start
            length = len(prompt_ids)  # tokens in the target cache; `pending` goes at this position
            while not done:
                emitted, aux_rows, accept_len = round_fn(s, pending, root, length)
                res.accept_lens.append(accept_len)
                done = _finish(res.tokens, emitted.tolist(), self.eos, max_new_tokens)
                if done:
                    break
                root = self.commit(s, emitted.to(self.device), aux_rows, length)
                length += accept_len + 1
                pending = emitted[-1]
        res.seconds = time.perf_counter() - start
        return res

    def _chain_round(self, s: _Session, pending, root, length):
        d = self.depth
        h = root
        drafted, qs = [], []
        for k in range(d):
            tok, q = self.pick(s, self.draft.logits(h)[0, -1])
            tok_t = self.draft_to_target_ids[tok]
            drafted.append(tok_t)
            qs.append(q)
            if k < d - 1:  # the last token needs no entry: nothing drafts after it
                s.result.draft_calls += 1
                h = self.draft(tok_t.view(1, 1), h, s.dcache, length + k, from_target=False)
        drafted_t = torch.stack(drafted)
        ids = torch.cat([pending.view(1).to(self.device), drafted_t]).view(1, -1)
        hidden, aux = self._target(s, ids, length)
        logits = target_logits(self.target, hidden)
        if self.temperature <= 0:
            a, emitted = verify_chain_greedy(drafted_t, logits)
        else:
            qt = torch.zeros(d, self.vocab, dtype=torch.float32, device=self.device)
            qt[:, self.draft_to_target_ids] = torch.stack(qs).float()
            p = logits_to_probs(logits, self.temperature, self.top_p)
            a, emitted = verify_chain_sampling(drafted_t, qt, p, s.generator)
        return emitted, aux[: a + 1], a

    def _tree_round(self, s: _Session, pending, root, length):
        k, dev = self.topk, self.device
        lp = torch.log_softmax(self.draft.logits(root)[0, -1].float(), -1)
        sc, tok = lp.topk(min(k, lp.shape[-1]))
        n_cand = tok.shape[0]
        cand_tok, cand_par, cand_sc = [tok], [torch.full_like(tok, -1)], [sc]
        # the frontier: draft ids, scores, candidate indices, the hidden input of each one's
        # entry, and which scratch slots (from slot `length` on) its ancestors' entries occupy
        f_tok, f_sc, f_idx = tok, sc, torch.arange(n_cand, device=dev)
        f_hid = root[0].expand(n_cand, -1)
        f_anc = torch.zeros(n_cand, (self.depth - 1) * k, dtype=torch.bool, device=dev)
        used = 0  # scratch slots written so far
        for level in range(1, self.depth):
            nf = f_tok.shape[0]
            f_anc[torch.arange(nf, device=dev), used + torch.arange(nf, device=dev)] = True  # each sees itself
            mask = torch.cat([torch.ones(nf, length, dtype=torch.bool, device=dev), f_anc[:, : used + nf]], dim=1)
            s.result.draft_calls += 1
            out = self.draft(
                self.draft_to_target_ids[f_tok].view(1, -1),
                f_hid.unsqueeze(0),
                s.dcache,
                length + used,
                from_target=False,
                position=length - 1 + level,  # siblings share their depth's position
                mask=mask,
            )
            used += nf
            lp = torch.log_softmax(self.draft.logits(out)[0].float(), -1)
            sc, tok, slot = expand_frontier(f_sc, lp, min(k, lp.shape[-1]))
            slot = slot.to(dev)
            cand_tok.append(tok)
            cand_par.append(f_idx[slot])
            cand_sc.append(sc)
            best = sc.topk(min(k, sc.shape[0])).indices
            f_tok, f_sc, f_idx = tok[best], sc[best], n_cand + best
            f_hid, f_anc = out[0][slot[best]], f_anc[slot[best]]
            n_cand += tok.shape[0]
        # SGLang counts the root among the verified tokens: num_draft_tokens - 1 tree nodes
        tree = select_nodes(
            torch.cat(cand_tok).cpu(), torch.cat(cand_par).cpu(), torch.cat(cand_sc).cpu(), self.num_draft_tokens - 1
        )
        tree_tokens = self.draft_to_target_ids[tree.tokens.to(dev)]
        ids = torch.cat([pending.view(1).to(dev), tree_tokens]).view(1, -1)
        pos = tree_position_ids(tree.depths, length).to(dev)
        hidden, aux = self._target(s, ids, length, positions=pos, visible=tree_attention_mask(tree.parents).to(dev))
        logits = target_logits(self.target, hidden)
        if self.temperature <= 0:
            path, emitted = verify_tree_greedy(tree_tokens.cpu(), tree.parents, logits)
        else:
            p = logits_to_probs(logits, self.temperature, self.top_p)
            path, emitted = verify_tree_sampling(tree_tokens, tree.parents, p, s.generator)
        rows = [0] + [i + 1 for i in path]
        s.kv.keep_path(length, rows)
        return emitted, aux[rows], len(path)
