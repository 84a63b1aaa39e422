"""Heads for tests: a random head saved for a target, and a draft started from a target's weights."""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3cli.head.read import init_draft_from_weights
from eagle3cli.head.write import save_head
from eagle3cli.model.target import load_target, target_identity
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target
from eagle3cli.speculate.vocab import t2d_of


def make_head(
    target_dir: Path,
    out: Path,
    seed: int = 0,
    aux=None,
    norm_before_fc: bool = False,
    norm_before_residual: bool = False,
) -> Path:
    """A random head (512-token draft vocab) for the target in `target_dir`, saved at `out`; with
    EAGLE-3.1's norms when asked (input_norm's weights then random too, so a mix-up shows)."""
    model, tok, path = load_target(target_dir)
    aux = aux or default_aux_layer_ids(model.config.num_hidden_layers)
    cfg = draft_config_from_target(model.config, 512, aux, norm_before_fc, norm_before_residual)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    if draft.input_norm is not None:
        with torch.no_grad():
            draft.input_norm.weight.uniform_(0.5, 1.5)
    d2t = torch.arange(512)  # draft id i -> target id 2i
    draft.set_vocab_maps(d2t, t2d_of(d2t, model.config.vocab_size))
    return save_head(draft, out, target_identity(path, tok, model.config).as_dict())


def init_draft_from_target(
    draft: Eagle3Draft, target_model, d2t: torch.Tensor, t2d: torch.Tensor | None = None
) -> None:
    """`init_draft_from_weights` with the tensors of a loaded target model (its final norm's
    effective scale measured, so any norm convention is right)."""
    has_norm = getattr(getattr(target_model, "model", None), "norm", None) is not None
    init_draft_from_weights(
        draft,
        target_model.get_input_embeddings().weight,
        target_model.get_output_embeddings().weight,
        final_norm_scale(target_model) if has_norm else None,
        d2t,
        t2d,
    )


@torch.no_grad()
def final_norm_scale(model) -> torch.Tensor:
    """The effective per-channel scale of the loaded target's final norm, measured: on a constant
    vector of RMS 1e3 (eps is then negligible) an RMSNorm returns exactly its scale."""
    import copy

    norm = copy.deepcopy(model.model.norm).float().cpu()
    return norm(torch.full((1, norm.weight.shape[0]), 1e3))[0]
