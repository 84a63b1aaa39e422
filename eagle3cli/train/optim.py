"""The head's optimizer and initialisation choices (`--optimizer`, `--lm-head`, `--init`).

Muon orthogonalises the update of each 2-D weight matrix (Newton-Schulz), which speculators
found to train EAGLE-3 heads faster on little data; it does not apply to vectors (norms) and,
following common practice, not to the output head. Two optimizers then step together, so the
loop sees one object with the Optimizer methods it calls, and one schedule for both.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


class OptimizerPair:
    """Muon for `matrices`, AdamW for `others`, stepped and saved as one."""

    def __init__(self, matrices: list, others: list, lr: float, weight_decay: float):
        self.muon = torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(others, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
        self.parts = (self.muon, self.adamw)

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.parts for g in o.param_groups]

    def step(self) -> None:
        for o in self.parts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


class SchedulerPair:
    """One LambdaLR per optimizer of an OptimizerPair, same schedule."""

    def __init__(self, pair: OptimizerPair, fn: Callable[[int], float]):
        self.parts = tuple(torch.optim.lr_scheduler.LambdaLR(o, fn) for o in pair.parts)

    def step(self) -> None:
        for s in self.parts:
            s.step()

    def get_last_lr(self) -> list[float]:
        return [float(x) for x in self.parts[1].get_last_lr()]

    def state_dict(self) -> dict:
        return {"muon": self.parts[0].state_dict(), "adamw": self.parts[1].state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.parts[0].load_state_dict(state["muon"])
        self.parts[1].load_state_dict(state["adamw"])


def build_optimizer(draft, kind: str, lr: float, weight_decay: float, schedule: Callable[[int], float]):
    """(optimizer, scheduler) over the draft's trainable parameters."""
    named = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    if kind == "muon":
        matrices = [p for n, p in named if p.ndim == 2 and not n.startswith("lm_head")]
        others = [p for n, p in named if not (p.ndim == 2 and not n.startswith("lm_head"))]
        pair = OptimizerPair(matrices, others, lr, weight_decay)
        return pair, SchedulerPair(pair, schedule)
    opt = torch.optim.AdamW([p for _, p in named], lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


SOFT_LOGIT_STD = 0.3


@torch.no_grad()
def apply_init(draft, init: str, lm_head: str) -> None:
    """The `--init` and `--lm-head` choices, after the draft took the target's weights."""
    if lm_head == "fresh":
        torch.nn.init.normal_(draft.lm_head.weight, std=1.0 / math.sqrt(draft.lm_head.weight.shape[1]))
    if lm_head == "frozen":
        draft.lm_head.weight.requires_grad_(False)
    if init in ("soft", "pass-top"):
        # the target's lm_head rows on an untrained layer's output give confident, wrong logits
        # (SmolLM2: a first loss of ~16 nats, ln(16384) = 9.7); a smaller output norm makes a random
        # hidden state's logits spread SOFT_LOGIT_STD, so training starts near ln(draft vocab)
        w, rows = draft.norm.weight, draft.lm_head.weight.float()
        spread = float((w.float().pow(2) * rows.pow(2)).sum(-1).mean().sqrt())
        if spread > 0:
            w.mul_(SOFT_LOGIT_STD / spread)
    if init == "pass-top":
        h = draft.fc.weight.shape[0]
        # [low | mid | high] aux features, each H wide. EAGLE-3.1's norms (input_norm, a normed
        # residual) only rescale the passed feature by a positive number per token, which the final
        # RMSNorm removes: step 0 still starts as the target's read-out of that layer.
        if draft.config.target_hidden_size == h:
            draft.fc.weight.zero_()
            draft.fc.weight[:, -h:] = torch.eye(h, dtype=draft.fc.weight.dtype)
        layer = draft.midlayer
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
