"""The EAGLE-3 draft head, with the exact parameter names SGLang/vLLM load.

    fc            Linear(n_aux * H_target -> H, no bias) over the concatenated aux features
    midlayer      one Llama decoder layer whose attention reads
                  [input_layernorm(embed(token)), hidden_norm(h)] (2H wide); residual from h
    norm, lm_head RMSNorm, then logits over the draft vocabulary
    d2t, t2d      draft->target id offsets (target = draft + d2t[draft]) and a target-vocab mask

The token embedding is the target's, frozen, and is not part of the exported head.

Two ways to run it:
  * `ttt_unroll` — training-time test over a whole sequence: step k at anchor t reads the
    token x[t+1+k] and its own step-(k-1) hidden state, attends step-0 keys <= t causally and
    only the anchor's own keys from steps 1..k (the diagonal), at rope position t+k. Cost is
    K forward passes of one layer, never K^2 sequence re-computations.
  * `forward` with a `DraftCache` — incremental drafting for decoding: committed positions
    (step-0 entries from target features) stay in the cache; speculative entries are
    appended with an explicit visibility mask (chain or tree) and cropped after verification.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)


def draft_config_from_target(
    target_config: LlamaConfig | dict,
    draft_vocab_size: int,
    aux_layer_ids: tuple[int, ...],
) -> LlamaConfig:
    """The head's Llama config: the target's width/heads/rope, one layer, the draft vocab.

    `aux_layer_ids` use eagle3's convention: index into `output_hidden_states`
    (= the input of decoder layer k). Engine-specific ids are written by `export`.
    """
    t = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    if isinstance(t.get("text_config"), dict) and t["text_config"]:
        t = t["text_config"]
    keep = (
        "hidden_size intermediate_size num_attention_heads num_key_value_heads head_dim rms_norm_eps "
        "rope_theta rope_scaling rope_parameters max_position_embeddings bos_token_id eos_token_id pad_token_id"
    ).split()
    fields = {k: t[k] for k in keep if k in t and t[k] is not None}
    fields.update(draft_rope(t))
    cfg = LlamaConfig(
        **fields,
        vocab_size=t["vocab_size"],
        num_hidden_layers=1,
        tie_word_embeddings=False,
        # Not the target's: SGLang's and vLLM's Llama MLP run SiLU only, and SGLang's EAGLE-3 layer
        # builds q/k/v without bias whatever the config says (vLLM adds them when attention_bias
        # is set), so a head with biases would load differently in the two engines.
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )
    cfg.draft_vocab_size = int(draft_vocab_size)
    cfg.target_hidden_size = int(t["hidden_size"])
    cfg.aux_layer_ids = [int(i) for i in aux_layer_ids]
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    return cfg


def draft_rope(target: dict) -> dict:
    """The rope fields of the draft layer, flat (the engines read one rope per Llama config).

    Targets with per-layer-type rope (Gemma-3: `rope_parameters = {"full_attention": {...},
    "sliding_attention": {...}}`) give the full-attention layers' rope: the draft attends the
    whole context, as the target's global layers do, not a window.
    """
    rp = target.get("rope_parameters")
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        chosen = rp.get("full_attention") or next(iter(rp.values()))
        return {"rope_parameters": dict(chosen)}
    return {}


class DraftAttention(nn.Module):
    """GQA attention whose q/k/v read the 2H-wide [embed; hidden] input."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.num_heads
        # No biases, whatever the target has: see draft_config_from_target (engines disagree on them).
        self.q_proj = nn.Linear(2 * h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated q [B,nh,T,d], k [B,nkv,T,d] and v [B,nkv,T,d]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def expand_kv(self, kv: torch.Tensor) -> torch.Tensor:
        rep = self.num_heads // self.num_kv_heads
        return kv if rep == 1 else kv.repeat_interleave(rep, dim=1)


class DraftDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.self_attn = DraftAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual from the (un-normed) hidden input, then the MLP block."""
        b, _, t, _ = attn_out.shape
        h = hidden + self.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class DraftCache:
    """Keys/values of the draft layer: committed entries first, then speculative ones."""

    k: torch.Tensor | None = None  # [B, nkv, S, d]
    v: torch.Tensor | None = None
    committed: int = 0  # entries [0, committed) are step-0 entries of accepted tokens

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)

    def crop(self, length: int) -> None:
        """Drop entries past `length` (speculative ones after a verification)."""
        if self.k is not None and self.k.shape[2] > length:
            self.k = self.k[:, :, :length]
            self.v = self.v[:, :, :length]

    def commit(self) -> None:
        self.committed = self.length


class Eagle3Draft(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        n_aux = len(config.aux_layer_ids)
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # the target's; frozen, never exported
        self.fc = nn.Linear(n_aux * config.target_hidden_size, h, bias=False)
        self.midlayer = DraftDecoderLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    # ------------------------------------------------------------ shared pieces
    def set_vocab_maps(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t.to(torch.long))
        self.t2d.copy_(t2d.to(torch.bool))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits from the pre-norm hidden state the layer returns."""
        return self.lm_head(self.norm(hidden))

    def project(self, hidden: torch.Tensor, from_target: bool) -> torch.Tensor:
        """fc over target aux features; the draft's own states pass unchanged.

        Explicit rather than by width (as SGLang does): with the top-only ablation the aux
        features are exactly H wide and would skip fc by accident.
        """
        return self.fc(hidden) if from_target else hidden

    def _rope(self, x: torch.Tensor, position_ids: torch.Tensor):
        return self.rotary_emb(x, position_ids)

    # ------------------------------------------------------------ decoding
    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DraftCache,
        from_target: bool,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run n new entries; returns their pre-norm output hidden states [B, n, H].

        input_ids [B,n] are the tokens *after* each entry's feature (x[t+1] for feature t);
        hidden: target features [B,n,n_aux*H] (from_target=True) or the draft's own [B,n,H].
        `visible` [n, S_old] says which existing cache entries each new entry sees (default:
        all); among the new entries attention is causal. Trees pass ancestor masks here.
        """
        layer = self.midlayer
        hidden = self.project(hidden, from_target)
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        x = layer.attn_input(embeds, hidden)
        cos, sin = self._rope(x, position_ids)
        q, k, v = layer.self_attn.qkv(x, cos, sin)
        n, s_old = q.shape[2], cache.length
        cache.append(k, v)
        mask = torch.ones(n, s_old + n, dtype=torch.bool, device=q.device)
        if visible is not None:
            mask[:, :s_old] = visible
        mask[:, s_old:] = torch.tril(mask.new_ones(n, n))
        attn = layer.self_attn
        out = F.scaled_dot_product_attention(
            q, attn.expand_kv(cache.k), attn.expand_kv(cache.v), attn_mask=mask, scale=1.0 / math.sqrt(attn.head_dim)
        )
        return layer.finish(hidden, out)

    # ------------------------------------------------------------ training-time test
    def ttt_unroll(
        self,
        input_ids: torch.Tensor,
        aux_hidden: torch.Tensor,
        steps: int,
        position_ids: torch.Tensor | None = None,
    ) -> Iterator[torch.Tensor]:
        """Yield the pre-norm hidden state of every TTT step k = 0..steps-1, each [B, T, H].

        Step k at anchor t reads token x[t+1+k] (padding past the end; the caller's loss mask
        must exclude those anchors) and predicts x[t+2+k]. Sequences are right-padded, so
        causal attention never lets a real anchor see padding.
        """
        b, t = input_ids.shape
        layer, attn = self.midlayer, self.midlayer.self_attn
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).unsqueeze(0).expand(b, t)
        scale = 1.0 / math.sqrt(attn.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
        hidden = self.fc(aux_hidden)
        k0 = v0 = None
        diag_k: list[torch.Tensor] = []
        diag_v: list[torch.Tensor] = []
        for k in range(steps):
            tokens = F.pad(input_ids[:, 1 + k :], (0, 1 + k), value=0)[:, :t]
            embeds = self.embed_tokens(tokens).to(hidden.dtype)
            x = layer.attn_input(embeds, hidden)
            cos, sin = self._rope(x, position_ids + k)
            q, kk, vv = attn.qkv(x, cos, sin)
            if k == 0:
                k0, v0 = attn.expand_kv(kk), attn.expand_kv(vv)
            else:
                diag_k.append(attn.expand_kv(kk))
                diag_v.append(attn.expand_kv(vv))
            scores = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [B,nh,T,T]
            scores = scores.masked_fill(~causal, float("-inf"))
            if diag_k:
                # each later step contributes exactly one key per anchor: its own position
                diag = torch.stack([(q * dk).sum(-1) for dk in diag_k], dim=-1) * scale  # [B,nh,T,k]
                probs = torch.softmax(torch.cat([scores, diag], dim=-1).float(), dim=-1).to(q.dtype)
                out = torch.matmul(probs[..., :t], v0)
                out = out + sum(probs[..., t + j, None] * dv for j, dv in enumerate(diag_v))
            else:
                out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v0)
            hidden = layer.finish(hidden, out)
            yield hidden
