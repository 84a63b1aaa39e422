"""The embedded backend: transformers with a KV cache, batched, left-padded, length-bucketed.

A hand-written decode loop rather than `model.generate`: finished rows leave the batch (their
cache rows are dropped), each row samples from its own seeded generator (so a row's text does
not depend on which rows share its batch), and only the last position's logits are computed.
"""

from __future__ import annotations

import torch

from ..model.chat import TemplateRefusal, render, split_reasoning
from ..model.kvcache import growing_cache
from ..speculate.sampling import generator_for, logits_to_probs, sample_from
from ..speculate.target import eos_token_ids
from .levers import cut_at_end, user_prefix
from .regen import Conversation, OnDone, Sampling, TurnOutput


def render_prompt(
    tokenizer, messages: list[dict], tools: list | None = None, template_kwargs: dict | None = None
) -> str:
    """The generation prompt; `TemplateRefusal` when the template refuses the conversation."""
    return render(tokenizer, messages, True, tools, template_kwargs)


def encode_prompt(
    tokenizer, messages: list[dict], tools: list | None = None, template_kwargs: dict | None = None
) -> list[int]:
    # The template writes any BOS itself; adding special tokens again would double it.
    return tokenizer(render_prompt(tokenizer, messages, tools, template_kwargs), add_special_tokens=False).input_ids


def decode_turn(tokenizer, ids: list[int]) -> tuple[str | None, str]:
    """(reasoning, answer) of generated ids: `<think>` text, or harmony channels (special tokens,
    so they are read before special tokens are dropped)."""
    raw = tokenizer.decode(ids, skip_special_tokens=False)
    if "<|channel|>" in raw:
        return split_reasoning(raw)
    return split_reasoning(tokenizer.decode(ids, skip_special_tokens=True))


def _pick(logits: torch.Tensor, sampling: Sampling, gens: list[torch.Generator] | None) -> torch.Tensor:
    """One token per row; each sampled row draws with its own generator (seeded per record and turn)."""
    if sampling.greedy or gens is None:
        return logits.argmax(-1)
    probs = logits_to_probs(logits, sampling.temperature, sampling.top_p)
    return torch.stack([sample_from(probs[j], g) for j, g in enumerate(gens)])


class HFBackend:
    name = "hf"

    def __init__(
        self,
        model,
        tokenizer,
        sampling: Sampling,
        batch_size: int = 32,
        max_prompt_tokens: int | None = None,
    ):
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.stop_ids = eos_token_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.stop_ids))
        limit = getattr(model.config, "max_position_embeddings", None)
        self.max_prompt_tokens = max_prompt_tokens or (limit - sampling.max_new_tokens if limit else None)
        self._max_chars: int | None = None

    # -------------------------------------------------------------- one batch of prompts
    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], seeds: list[int] | None = None, sampling: Sampling | None = None
    ) -> list[TurnOutput]:
        """Generate for prompts of any lengths (one left-padded batch); stops at EOS or max_new_tokens."""
        s, dev = sampling or self.sampling, self.device
        B, T = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, T - len(p) :] = torch.tensor(p)
            mask[i, T - len(p) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = None
        if not s.greedy:
            gens = [generator_for(dev, int(x)) for x in (seeds or [s.seed] * B)]
        cache = growing_cache(self.model.config)  # one write per token, not a copy of the cache
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1
        ).logits[:, -1]
        next_pos = pos[:, -1] + 1
        alive = list(range(B))
        out_ids: list[list[int]] = [[] for _ in range(B)]
        finish: list[str | None] = [None] * B
        stop = torch.tensor(sorted(self.stop_ids), device=dev)
        for _ in range(s.max_new_tokens):
            tok = _pick(logits, s, gens)
            is_stop = torch.isin(tok, stop).tolist()
            toks = tok.tolist()
            keep = []
            for j, row in enumerate(alive):
                if is_stop[j]:
                    finish[row] = "stop"
                    continue
                out_ids[row].append(toks[j])
                if len(out_ids[row]) >= s.max_new_tokens:
                    finish[row] = "length"
                else:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(alive):
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                mask, tok, next_pos = mask[sel], tok[sel], next_pos[sel]
                alive = [alive[j] for j in keep]
                if gens is not None:
                    gens = [gens[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=1)
            logits = self.model(
                input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], cache=cache, use_cache=True
            ).logits[:, -1]
            next_pos = next_pos + 1
        outs = []
        for i in range(B):
            reasoning, answer = decode_turn(self.tokenizer, out_ids[i])
            outs.append(
                TurnOutput(
                    answer, finish[i] or "length", len(prompts[i]), len(out_ids[i]) + (finish[i] == "stop"), reasoning
                )
            )
        return outs

    def batches(self, prompts: list[list[int]]) -> list[list[int]]:
        """Indices of prompts in batches of similar length (sorted), so little compute goes to padding."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        return [order[k : k + self.batch_size] for k in range(0, len(order), self.batch_size)]

    def generate_sorted(self, prompts: list[list[int]], seeds: list[int]) -> list[TurnOutput]:
        """All prompts, length-bucketed into batches; results in input order."""
        results: dict[int, TurnOutput] = {}
        for chunk in self.batches(prompts):
            results.update(zip(chunk, self.generate([prompts[i] for i in chunk], [seeds[i] for i in chunk])))
        return [results[i] for i in range(len(prompts))]

    def max_prompt_chars(self) -> int:
        """Characters that --max-prompt-tokens tokens can hold at most, with a margin of 2: no token
        of this vocabulary stands for more characters than its longest entry has."""
        if self._max_chars is None:
            longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
            self._max_chars = 2 * int(self.max_prompt_tokens or 0) * max(longest, 1)
        return self._max_chars

    # -------------------------------------------------------------- conversations
    def regenerate(self, convs: list[Conversation], on_done: OnDone) -> None:
        """Turn by turn across all conversations: round r answers every conversation's r-th user
        turn, with the answers of rounds < r already in its history."""
        active = [c for c in convs]
        while active:
            prompts, seeds, batch = [], [], []
            markers: list[str | None] = []
            for c in active:
                msgs = c.history()
                marker = None
                try:
                    if c.writes_user:  # the target writes the user turn: its template up to the user's text
                        text, marker = user_prefix(
                            self.tokenizer, msgs, c.template_kwargs, c.record["meta"].get("topic")
                        )
                    else:
                        text = render_prompt(self.tokenizer, msgs, c.tools, c.template_kwargs)
                except TemplateRefusal as e:  # e.g. Gemma-2's "System role not supported": this record only
                    c.fail(TemplateRefusal.reason, f"turn {c.turn}: {e.message}")
                    continue
                if self.max_prompt_tokens and len(text) > self.max_prompt_chars():
                    # by size first: tokenising a 50 MB row to learn it is too long took 8 GB
                    c.fail(
                        "prompt_too_long",
                        f"turn {c.turn} prompt has {len(text):,} characters, more than {self.max_prompt_tokens} "
                        "tokens can hold",
                    )
                    continue
                p = self.tokenizer(text, add_special_tokens=False).input_ids  # the template writes any BOS
                if self.max_prompt_tokens and len(p) > self.max_prompt_tokens:
                    c.fail(
                        "prompt_too_long", f"turn {c.turn} prompt has {len(p)} tokens, limit {self.max_prompt_tokens}"
                    )
                    continue
                prompts.append(p)
                seeds.append(c.seed(self.sampling))
                batch.append(c)
                markers.append(marker)
            for c in active:
                if c.done:  # rejected before generating (prompt too long, template refusal)
                    on_done(c)
            # one batch shares one sampling: group by it (user turns, answers at several temperatures)
            groups: dict[Sampling, list[int]] = {}
            for i, c in enumerate(batch):
                groups.setdefault(c.sampling(self.sampling), []).append(i)
            for samp, members in groups.items():
                for sub in self.batches([prompts[i] for i in members]):
                    chunk = [members[j] for j in sub]
                    outs = self.generate([prompts[i] for i in chunk], [seeds[i] for i in chunk], sampling=samp)
                    for i, out in zip(chunk, outs):
                        marker = markers[i]
                        if marker is not None:
                            out.text = cut_at_end(out.text, marker)
                        batch[i].add(out)
                        if batch[i].done:  # journaled per batch: a kill loses at most the batch in flight
                            on_done(batch[i])
            active = [c for c in active if not c.done]
