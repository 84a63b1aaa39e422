"""The target model as the method sees it: its logits, its family's logit and norm quirks, its stop
tokens and the capture of its EAGLE-3 aux features. Nothing here opens files or folders (that is
`model/target.py`, the one way stages open a target).

eagle3's layer-id convention: an aux id k is an index into transformers'
`output_hidden_states`, i.e. the *input* of decoder layer k (`speculate/aux_layers.py` holds the
defaults, the engines' conventions and the rule for valid ids). Capture uses forward
pre-hooks on exactly those layers, so no other layer's states are kept and the lm_head
(a 128k-wide matmul on real targets) is skipped unless logits are asked for.

Family facts live here too: `target_logits` (lm_head + the family's logit processing, e.g.
Gemma-2 softcapping), `final_norm_offset` (Gemma's (1 + w) norms).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def text_config(config):
    """The text model's config of a target: `text_config` of a multimodal config (a config.json dict
    or a transformers config object), else the config itself. The one place it is unwrapped."""
    if isinstance(config, dict):
        text = config.get("text_config")
        return text if isinstance(text, dict) and text else config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def eos_token_ids(model, tokenizer=None) -> set[int]:
    """Every id that ends a turn: the generation config's, the model config's and the tokenizer's
    (instruct models often list several, e.g. Llama 3's <|eot_id|> and <|end_of_text|>)."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            ids.update(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]))
    return ids


# ---------------------------------------------------------------- family facts
# Families whose RMSNorm multiplies by (1 + weight): their checkpoints store the weight
# zero-centred (Gemma initialises it to 0). Copied into a Llama RMSNorm (x * weight) as is, the
# draft's final norm would zero the logits; `final_norm_offset` says what to add (tests check it
# against the scale the loaded module applies).
ZERO_CENTRED_NORM_TYPES = frozenset(
    "gemma gemma2 gemma3 gemma3_text recurrent_gemma vaultgemma qwen3_next qwen3_5 qwen3_5_text "
    "qwen3_5_moe qwen3_5_moe_text".split()
)


def _field(config, key: str):
    """A field of a config object or config.json dict (the text config of multimodal targets)."""
    text = text_config(config)
    return text.get(key) if isinstance(text, dict) else getattr(text, key, None)


def final_norm_offset(config) -> float:
    """What to add to the target's stored final-norm weight to get its effective scale."""
    return 1.0 if _field(config, "model_type") in ZERO_CENTRED_NORM_TYPES else 0.0


@dataclass(frozen=True)
class LogitSpec:
    """How a family turns lm_head outputs z into its logits: `softcap * tanh(scale * z / softcap)`."""

    scale: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and not self.softcap


def logit_spec(config) -> LogitSpec:
    """Gemma-2's `final_logit_softcapping`, Cohere's `logit_scale`, Granite's `logits_scaling`."""
    scale = 1.0
    if str(_field(config, "model_type") or "").startswith("cohere") and _field(config, "logit_scale"):
        scale *= float(_field(config, "logit_scale"))
    if _field(config, "logits_scaling"):
        scale /= float(_field(config, "logits_scaling"))
    cap = _field(config, "final_logit_softcapping")
    return LogitSpec(scale, float(cap) if cap else None)


def apply_logit_spec(logits: torch.Tensor, spec: LogitSpec | None) -> torch.Tensor:
    if spec is None or spec.identity:
        return logits
    if spec.scale != 1.0:
        logits = logits * spec.scale
    if spec.softcap:
        logits = torch.tanh(logits / spec.softcap) * spec.softcap
    return logits


def target_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The target's next-token logits from its final-normed hidden states, exactly as its own
    forward computes them: lm_head, then the family's processing (softcapping, logit scale).
    Teachers, sampling at T > 0 and acceptance tests must use this, not `lm_head` alone."""
    return apply_logit_spec(model.lm_head(hidden), logit_spec(model.config))


def num_layers(model) -> int:
    return model.config.num_hidden_layers


def decoder_layers(model):
    return model.model.layers


class AuxCapture:
    """Context manager: records the inputs of the chosen decoder layers during a forward."""

    def __init__(self, model, aux_layer_ids: tuple[int, ...]):
        self.model, self.ids = model, tuple(aux_layer_ids)
        self.states: dict[int, torch.Tensor] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> AuxCapture:
        layers = decoder_layers(self.model)
        for i in self.ids:

            def hook(_mod, args, kwargs, i=i):
                self.states[i] = args[0] if args else kwargs["hidden_states"]

            self._handles.append(layers[i].register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def concat(self) -> torch.Tensor:
        """[B, T, n_aux*H], in the order of aux_layer_ids (the order fc was trained on)."""
        return torch.cat([self.states[i] for i in self.ids], dim=-1)


@torch.no_grad()
def capture_features(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, aux_layer_ids: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [B,T,n_aux*H], last_hidden [B,T,H]) for a batch; last_hidden is after the final norm,
    so teacher logits are exactly `target_logits(model, last_hidden)`."""
    with AuxCapture(model, aux_layer_ids) as cap:
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return cap.concat(), out.last_hidden_state
