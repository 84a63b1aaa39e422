"""The EAGLE-3 draft head, with the exact parameter names SGLang/vLLM load.

    fc            Linear(n_aux * H_target -> H, no bias) over the concatenated aux features
    midlayer      one Llama decoder layer whose attention reads
                  [input_layernorm(embed(token)), hidden_norm(h)] (2H wide); residual from h
    norm, lm_head RMSNorm, then logits over the draft vocabulary
    d2t, t2d      draft->target id offsets (target = draft + d2t[draft]) and a target-vocab mask

Two optional norms of EAGLE-3.1 (speculators' and vLLM's names; both off by default, which is the
original EAGLE-3 head, unchanged):
    norm_before_fc        `input_norm`, one RMSNorm over the whole concatenated aux features
                          (n_aux * H_target wide) before fc; the draft's own states skip it, as
                          they skip fc
    norm_before_residual  the decoder layer's residual is hidden_norm(h) instead of the raw h
                          (the attention input is hidden_norm(h) either way)

The token embedding is the target's, frozen, and is not part of the exported head.

Two ways to run it:
  * `ttt_unroll` — training-time test over a whole sequence: step k at anchor t reads the
    token x[t+1+k] and its own step-(k-1) hidden state, attends step-0 keys <= t causally and
    only the anchor's own keys from steps 1..k (the diagonal), at rope position t+k. Cost is
    K forward passes of one layer, never K^2 sequence re-computations.
  * `forward` with a `DraftCache` (from `new_cache`) — the one incremental draft step that
    decoding runs: entries are written into a preallocated, position-indexed KV buffer
    (committed and chain entries sit at the slot equal to their position, so a rejected draft
    needs no crop: the next write overwrites it), with an explicit visibility mask for tree
    levels. Tests prove `ttt_unroll` equals chained `forward` calls.

Why two formulations of one layer: decoding is per-call-overhead bound (fused projections, one
fused norm, writes into a preallocated buffer, no autograd), while training needs autograd through
module calls (ZeRO-3 gathers partitioned weights only inside a module's forward) and all K steps
over a whole sequence at once. Each is the fast one for its job; the equality test keeps them one
layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

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

from ..model.cpu_kernels import is_packed, packed_or_plain
from .target import text_config
from .vocab import draft_to_target


def draft_config_from_target(
    target_config: LlamaConfig | dict,
    draft_vocab_size: int,
    aux_layer_ids: tuple[int, ...],
    norm_before_fc: bool = False,
    norm_before_residual: bool = False,
) -> LlamaConfig:
    """The head's Llama config: the target's width/heads/rope, one layer, the draft vocab.

    `aux_layer_ids` use eagle3's convention: index into `output_hidden_states`
    (= the input of decoder layer k). Engine-specific ids are written by `export`.
    The two norm flags are EAGLE-3.1's (module docstring); they are written to the config
    even when off, under the names vLLM and llama.cpp's converter read.
    """
    t = text_config(target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config))
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
    cfg.norm_before_fc = bool(norm_before_fc)
    cfg.norm_before_residual = bool(norm_before_residual)
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    return cfg


def norm_flags(config) -> tuple[bool, bool]:
    """(norm_before_fc, norm_before_residual) of a draft config; a config without them (written
    before they existed) is the original head: both off."""
    return bool(getattr(config, "norm_before_fc", False)), bool(getattr(config, "norm_before_residual", False))


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
        self.num_heads: int = config.num_attention_heads
        # LlamaConfig fills a missing num_key_value_heads with num_attention_heads (no GQA)
        self.num_kv_heads: int = config.num_key_value_heads or self.num_heads
        self.head_dim: int = getattr(config, "head_dim", None) or h // self.num_heads
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
        self.norm_before_residual: bool = norm_flags(config)[1]

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the 2H-wide attention input [input_layernorm(embeds); hidden_norm(hidden)], the residual):
        the raw hidden state, or with norm_before_residual the normed one."""
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        return x, normed if self.norm_before_residual else hidden

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The attention output added to the residual (from `attn_input`), then the MLP block."""
        b, _, t, _ = attn_out.shape
        h = residual + self.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


def _rms(x: torch.Tensor, norm: LlamaRMSNorm) -> torch.Tensor:
    """LlamaRMSNorm's maths in one fused op (the module's forward is seven ops, which is most of
    its cost at decode sizes); fp32 statistics for low-precision inputs, as the module does."""
    w = norm.weight
    if x.dtype == torch.float32 or x.dtype == torch.float64:
        return F.rms_norm(x, w.shape, w, norm.variance_epsilon)
    return w * F.rms_norm(x.float(), w.shape, None, norm.variance_epsilon).to(x.dtype)


class DraftCache:
    """What one decoding session with a draft head keeps between draft steps.

    k, v     [B, nkv, max_len, d] preallocated keys/values of the draft layer. Committed and chain
             entries sit at the slot equal to their rope position; tree levels use scratch slots
             past the committed prefix. Nothing is ever cropped or concatenated: a write
             overwrites what a rejected draft left there, and a step reads slots [0, end).
    cos, sin [max_len, d] the rope table, computed once.
    qkv, gate_up  q/k/v and gate/up projections fused into one matmul each (copies of the
             parameters taken at creation: make a new cache after changing the weights).
    """

    def __init__(self, draft: Eagle3Draft, max_len: int, batch: int = 1):
        attn = draft.midlayer.self_attn
        w = draft.fc.weight
        self.max_len = int(max_len)
        self.k = torch.zeros(batch, attn.num_kv_heads, self.max_len, attn.head_dim, dtype=w.dtype, device=w.device)
        self.v = torch.zeros_like(self.k)
        slots = torch.arange(self.max_len, device=w.device)
        cos, sin = draft.rotary_emb(self.k, slots.unsqueeze(0))
        self.cos, self.sin = cos[0], sin[0]
        self.slots = slots
        self.qkv, self.gate_up = draft.fused_projections()

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        if end > self.max_len:
            raise RuntimeError(f"draft KV buffer of {self.max_len} slots overflowed (writing up to slot {end})")
        if k.requires_grad:  # autograd (the TTT proof tests): keep earlier steps' saved views intact
            self.k = self.k.slice_scatter(k, dim=2, start=start, end=end)
            self.v = self.v.slice_scatter(v, dim=2, start=start, end=end)
        else:
            self.k[:, :, start:end] = k
            self.v[:, :, start:end] = v


class Eagle3Draft(nn.Module):
    d2t: torch.Tensor  # buffer [draft_vocab]: target id = draft id + d2t[draft id]
    t2d: torch.Tensor  # buffer [target vocab] bool: in the draft vocab

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
        # until set_vocab_maps: draft id i is target id i, and t2d says so (the maps always agree)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(config.vocab_size) < config.draft_vocab_size)
        # Made last and only when asked for: an RMSNorm draws no random numbers, and a head without
        # the flag keeps exactly the parameters (and checkpoints) it always had.
        self.input_norm: LlamaRMSNorm | None = None
        if norm_flags(config)[0]:
            self.input_norm = LlamaRMSNorm(n_aux * config.target_hidden_size, eps=config.rms_norm_eps)
        self._packed_fusions = None  # see fused_projections

    # ------------------------------------------------------------ shared pieces
    def set_vocab_maps(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t.to(torch.long))
        self.t2d.copy_(t2d.to(torch.bool))

    def fused_projections(self):
        """(q/k/v, gate/up) as one matmul each for decoding. A head packed for CPU decoding
        (`pack_linears`) is inference-only: its packed fusions are made once and reused (a
        reorder costs ~15 ms, a draft step ~1 ms); otherwise fresh copies of the weights."""
        if is_packed(self) and self._packed_fusions is not None:
            return self._packed_fusions
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp
        w_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        b_qkv = None if attn.q_proj.bias is None else torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        w_gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        b_gate_up = None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
        packed = is_packed(self)
        fused = packed_or_plain(w_qkv, b_qkv, packed), packed_or_plain(w_gate_up, b_gate_up, packed)
        if packed:
            self._packed_fusions = fused
        return fused

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_to_target(draft_ids, self.d2t)

    def logits(self, hidden: torch.Tensor, module_calls: bool | None = None) -> torch.Tensor:
        """Draft-vocab logits from the pre-norm hidden state the layer returns.

        `module_calls` (default: whether autograd is on, i.e. training): through the norm and lm_head
        modules, which lets ZeRO-3 gather their partitioned weights (a bare `.weight` is an empty
        shard there); else the fused norm of decoding. Training's held-out walk runs without
        autograd under ZeRO-3, so it asks for module calls explicitly."""
        if torch.is_grad_enabled() if module_calls is None else module_calls:
            return self.lm_head(self.norm(hidden))
        return self.lm_head(_rms(hidden, self.norm))

    def project(self, hidden: torch.Tensor, from_target: bool, module_calls: bool | None = None) -> torch.Tensor:
        """fc over target aux features (after `input_norm` with norm_before_fc); the draft's own
        states pass unchanged.

        Explicit rather than by width (as SGLang does): with the top-only ablation the aux
        features are exactly H wide and would skip fc by accident. `module_calls` as in `logits`
        (the norm's module, which ZeRO-3 can gather, or the fused norm of decoding).
        """
        if not from_target:
            return hidden
        if self.input_norm is not None:
            calls = torch.is_grad_enabled() if module_calls is None else module_calls
            hidden = self.input_norm(hidden) if calls else _rms(hidden, self.input_norm)
        return self.fc(hidden)

    def _rope(self, x: torch.Tensor, position_ids: torch.Tensor):
        return self.rotary_emb(x, position_ids)

    # ------------------------------------------------------------ decoding
    def new_cache(self, max_len: int, batch: int = 1) -> DraftCache:
        """A decoding session's draft state with room for `max_len` slots."""
        return DraftCache(self, max_len, batch)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        cache: DraftCache,
        start: int,
        from_target: bool,
        position: int | None = None,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """One draft step over n new entries; returns their pre-norm output hidden states [B, n, H].

        input_ids [B, n] are target ids of the tokens *after* each entry's feature (x[t+1] for
        feature t); hidden: target aux features [B, n, n_aux*H_target] (from_target) or the
        draft's own outputs [B, n, H]. The entries are written at slots [start, start+n) and
        attend slots [0, start+n). Rope position: the slot (committed and chain entries), or
        `position` for all n (the siblings of one tree level). `mask` [n, start+n] (bool, True =
        attend) says what each entry sees; None = every earlier slot and causal among the new.
        `last_only`: return only the last entry's output [B, 1, H] (committing accepted tokens: the
        earlier entries are needed only as keys, so their attention and MLP are skipped).
        """
        layer, attn = self.midlayer, self.midlayer.self_attn
        nh, nkv, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
        b, n = input_ids.shape
        end = start + n
        hidden = self.project(hidden.to(self.fc.weight.dtype), from_target)
        embeds = self.embed_tokens.weight[input_ids].to(hidden.dtype)
        normed = _rms(hidden, layer.hidden_norm)
        x = torch.cat([_rms(embeds, layer.input_layernorm), normed], dim=-1)
        residual = normed if layer.norm_before_residual else hidden
        qkv = cache.qkv(x)
        qk = qkv[..., : (nh + nkv) * hd].view(b, n, nh + nkv, hd)
        if position is None:
            cos, sin = cache.cos[start:end, None], cache.sin[start:end, None]  # [n, 1, d]
        else:
            cos, sin = cache.cos[position], cache.sin[position]
        # q and k heads share one rotation: rotate_half(x) = [-x2, x1]
        qk = qk * cos + torch.cat([-qk[..., hd // 2 :], qk[..., : hd // 2]], dim=-1) * sin
        q = qk[:, :, :nh].transpose(1, 2)
        k = qk[:, :, nh:].transpose(1, 2)
        v = qkv[..., (nh + nkv) * hd :].view(b, n, nkv, hd).transpose(1, 2)
        cache.write(start, k, v)
        if last_only and n > 1:
            if mask is not None:
                raise ValueError("last_only takes no mask: the last entry sees every slot before it")
            q, residual, n = q[:, :, -1:], residual[:, -1:], 1
        if mask is None and n > 1:
            mask = cache.slots[:end] <= cache.slots[start:end, None]
        out = F.scaled_dot_product_attention(
            q,
            cache.k[:, :, :end],
            cache.v[:, :, :end],
            attn_mask=mask,
            scale=1.0 / math.sqrt(hd),
            enable_gqa=nh != nkv,
        )
        h = residual + attn.o_proj(out.transpose(1, 2).reshape(b, n, nh * hd))
        gate, up = cache.gate_up(_rms(h, layer.post_attention_layernorm)).chunk(2, dim=-1)
        return h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)

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
        hidden = self.project(aux_hidden, from_target=True, module_calls=True)  # ZeRO-3 gathers in module calls
        k0: torch.Tensor | None = None
        v0: torch.Tensor | None = None
        diag_k: list[torch.Tensor] = []
        diag_v: list[torch.Tensor] = []
        for k in range(steps):
            tokens = F.pad(input_ids[:, 1 + k :], (0, 1 + k), value=0)[:, :t]
            embeds = self.embed_tokens(tokens).to(hidden.dtype)
            x, residual = layer.attn_input(embeds, hidden)
            cos, sin = self._rope(x, position_ids + k)
            q, kk, vv = attn.qkv(x, cos, sin)
            if k0 is None or v0 is None:  # step 0: the keys every later step attends to
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
                # sliced, not indexed at t + j: an index built from the length would make
                # torch.compile specialise on it (one compilation per sequence length)
                diag_p = probs[..., t:]
                out = out + sum(diag_p[..., j, None] * dv for j, dv in enumerate(diag_v))
            else:
                out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v0)
            hidden = layer.finish(residual, out)
            yield hidden
