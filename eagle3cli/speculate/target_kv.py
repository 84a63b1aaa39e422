"""The target's KV cache for speculative decoding: preallocated and position-indexed.

Slot s holds position s of the committed sequence. A forward writes its n inputs at slots
[start, start+n) and attends slots [0, start+n) through a mask we build, so:
  * a rejected chain suffix needs no crop: the next forward overwrites it;
  * an accepted tree path is moved into place with one small copy per layer (`keep_path`),
    never an index_select over the whole cache;
  * nothing is concatenated per call (transformers' DynamicCache re-allocates every layer's
    keys on every forward);
  * sliding-window layers (Mistral, Gemma-2/3, gpt-oss, Qwen with sliding layers) keep every
    key and see only their window through their mask. transformers' own sliding caches keep
    the last window-1 keys and cannot be rolled back once a rejected draft has pushed keys out
    (DynamicCache.crop refuses, StaticCache rolls in place).

Masks follow transformers' definitions (masking_utils: causal `kv <= q`, sliding window
`kv > q - window`, on positions), handed to the model as one 4D mask, or as a dict
`{layer_type: mask}` for models whose layers differ (they accept one in place of building
their own).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from . import Unsupported, attention_mask

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


class _SlotLayer(CacheLayerMixin):
    """One decoder layer's keys/values [B, heads, max_len, d], written at the cache's `start`."""

    def __init__(self, owner: TargetKV):
        super().__init__()
        self.owner = owner
        self.keys = self.values = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, _ = key_states.shape
        n = self.owner.max_len
        self.keys = key_states.new_zeros(b, h, n, key_states.shape[-1])
        self.values = value_states.new_zeros(b, value_states.shape[1], n, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # allocated by lazy_initialization
        s = self.owner.start
        e = s + key_states.shape[-2]
        keys[:, :, s:e] = key_states
        values[:, :, s:e] = value_states
        return keys[:, :, :e], values[:, :, :e]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.start + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.start

    def get_max_length(self) -> int:
        return self.owner.max_len


class TargetKV(Cache):
    """Position-indexed KV cache for one target and one sequence (batch 1)."""

    def __init__(self, model, max_len: int):
        config = model.config.get_text_config(decoder=True)
        types, kwargs = get_layer_types_and_kwargs(config)
        bad = sorted({t for t in types if t not in SUPPORTED_LAYER_TYPES})
        if bad:
            raise Unsupported(
                f"the target has {', '.join(bad)} layers; the speculative decoder supports "
                f"{' and '.join(SUPPORTED_LAYER_TYPES)} layers",
                "a decoder-only target with full or sliding-window attention",
            )
        self.max_len = int(max_len)
        # Where the running forward writes: set by `run` alone, for the length of its forward
        # (transformers' Cache.update carries no write position).
        self.start = 0
        self.slot_layers = [_SlotLayer(self) for _ in types]
        super().__init__(layers=[*self.slot_layers])
        # the mask each kind of layer needs: None = full attention, else its window
        windows = {t: kw.get("sliding_window") for t, kw in zip(types, kwargs)}
        named = getattr(config, "layer_types", None)
        # models with a `layer_types` config index a {layer_type: mask} dict; the others take one mask
        self.windows: dict[str | None, int | None] = (
            {t: windows[t] for t in dict.fromkeys(named)}
            if named and len(set(named)) > 1
            else {None: windows[types[0]]}
        )
        impl = getattr(config, "_attn_implementation", None) or "sdpa"
        # eager attention adds a float mask; sdpa (and the rest) take bool, True = attend
        self.float_mask_dtype = model.dtype if impl == "eager" else None
        dev = model.device
        self.positions = torch.arange(self.max_len, device=dev)

    def masks(self, start: int, n: int, positions: torch.Tensor | None = None, visible: torch.Tensor | None = None):
        """The attention mask(s) for n inputs written at slots [start, start+n).

        positions [n]: their rope positions (default start..start+n-1, a chain); visible [n, n]:
        which new inputs each sees (default causal; a tree passes its ancestor mask).
        """
        if start + n > self.max_len:
            raise RuntimeError(f"target KV buffer of {self.max_len} slots overflowed (writing up to {start + n})")
        if positions is None:
            positions = self.positions[start : start + n]
            keys = self.positions[: start + n]
        else:
            keys = torch.cat([self.positions[:start], positions])
        out = {}
        for name, window in self.windows.items():
            m = attention_mask(positions, keys, start, visible, window)
            if self.float_mask_dtype is not None:
                dt = self.float_mask_dtype
                m = torch.zeros(m.shape, dtype=dt, device=m.device).masked_fill_(~m, torch.finfo(dt).min)
            out[name] = m[None, None]
        return out[None] if None in out else out

    def run(self, model, ids: torch.Tensor, start: int, positions=None, visible=None) -> torch.Tensor:
        """The model's last hidden states [n, H] for ids [1, n] written at slots [start, start+n), with
        `masks(start, n, positions, visible)`; rope positions default to the slots."""
        n = ids.shape[1]
        mask = self.masks(start, n, positions, visible)
        pos = self.positions[start : start + n] if positions is None else positions
        self.start = start
        out = model.model(input_ids=ids, cache=self, use_cache=True, position_ids=pos[None], attention_mask=mask)
        return out.last_hidden_state[0]

    def keep_path(self, start: int, rows: list[int]) -> None:
        """After a tree verification written at slots [start, ...): move the inputs at offsets
        `rows` (root first, then the accepted path) to slots start, start+1, ..."""
        if rows == list(range(len(rows))):
            return
        src = torch.tensor(rows, device=self.positions.device) + start
        for layer in self.slot_layers:
            if layer.keys is not None and layer.values is not None:  # initialised
                layer.keys[:, :, start : start + len(rows)] = layer.keys.index_select(2, src)
                layer.values[:, :, start : start + len(rows)] = layer.values.index_select(2, src)
