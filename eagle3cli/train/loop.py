"""`run_train(cfg)`: setup() (train/setup.py) builds everything, fit() is the loop, finish() exports the head.

Single process on CPU/GPU by default; under the DeepSpeed launcher (`--deepspeed`) the same code
runs per rank with a DeepSpeed engine. On CPU in one process a run killed at any point and
re-run resumes from its last checkpoint with bit-identical losses (same data order, optimizer,
scheduler and RNG state). Under DeepSpeed resume restores the same state through the engine's
own checkpoints; bit-exactness then depends on the collective's reduction order (not promised).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from .. import console
from ..config import config_dict
from ..errors import StageError
from ..extras import require
from ..head.card import CARD
from ..head.check import nonfinite_tensors
from ..head.write import HEAD_FILES, save_head, self_check, write_card
from ..node.devices import check_device
from ..run_folder.folders import claim_output, refuse_link_out
from ..run_folder.lock import stage_lock
from ..run_folder.manifest import (
    StageManifest,
    atomic_write_json,
    read_json,
    remove_dead_temps,
    schema_problems,
    sha256_file,
    verify_shards,
    write_manifest,
)
from ..speculate.acceptance import conditional_acceptance, simulated_accept_length, simulated_tau
from ..speculate.ttt import Teacher, accuracies, teacher_from_hidden, teacher_from_topk
from . import checkpoint as ckpt
from .config import TrainConfig
from .data import OnlineSource, Prefetch, Ready, plan_for, prepare
from .heldout import heldout_acceptance, plot_curve
from .setup import Trainer, config_key, folder_shares, setup


# ---------------------------------------------------------------- state of the loop
@dataclass
class Interval:
    """Sums over the optimizer steps since the last metrics line, kept on the training device: the
    host reads them once, at the metrics line (a read per micro-step would stall the GPU on each)."""

    steps: int = 0
    micro: int = 0
    loss: torch.Tensor | None = None  # float64, as the host's float sum was
    step_loss: torch.Tensor | None = None
    sums: torch.Tensor | None = None  # [4, K]: correct, count, chain_correct, chain_count
    tokens: int = 0
    grad_norm: torch.Tensor | None = None  # float64
    started: float = field(default_factory=time.time)
    losses: list[torch.Tensor] = field(default_factory=list)  # this optimizer step's, checked at its end
    batches: list[list[int]] = field(default_factory=list)  # their samples, named if one is not finite

    def add(self, out, ready) -> None:
        s = torch.stack([out.correct, out.count, out.chain_correct, out.chain_count]).detach().float()
        self.sums = s if self.sums is None else self.sums + s
        sl = out.step_loss.detach().float()
        self.step_loss = sl if self.step_loss is None else self.step_loss + sl
        loss = out.loss.detach().double()
        self.loss = loss if self.loss is None else self.loss + loss
        self.losses.append(out.loss.detach())
        self.batches.append(ready.indices)
        self.micro += 1
        self.tokens += ready.tokens

    def add_norm(self, norm) -> None:
        n = norm.detach().double() if torch.is_tensor(norm) else torch.tensor(float(norm), dtype=torch.float64)
        self.grad_norm = n if self.grad_norm is None else self.grad_norm + n.to(self.grad_norm.device)


def new_best(tr: Trainer, m: dict) -> bool:
    """Whether this metrics line's held-out tau beats every earlier one; if so the loop records it
    and the checkpoint at this step becomes `best` (the one `--head-from best` exports)."""
    tau = m.get("heldout_tau")
    if tau is None or not tau > tr.loop.best:
        return False
    tr.loop.best, tr.loop.best_step = float(tau), tr.loop.step
    return True


def save_checkpoint(tr: Trainer, is_best: bool = False) -> None:
    tag = ckpt.ckpt_name(tr.loop.step)
    state = {
        **tr.loop.checkpoint(),  # step, epoch, batch_pos, best, tokens_seen, train_(cpu_)seconds, metrics
        "rng": ckpt.rng_state(),
        "config": config_key(tr.cfg),
        "input_fingerprint": tr.source.fingerprint,  # the cache (or data) these weights were trained on
    }
    if tr.deepspeed:
        tr.model.save_checkpoint(str(tr.train_dir / "deepspeed"), tag=tag)  # collective: every rank
        state["ds_tag"] = tag
    else:
        state.update(
            model={k: v for k, v in tr.draft.state_dict().items() if k != "embed_tokens.weight"},
            optimizer=tr.optimizer.state_dict(),
            scheduler=tr.scheduler.state_dict(),
        )
    if tr.rank == 0:
        ckpt.save(tr.train_dir, tr.loop.step, state, is_best, tr.cfg.keep_checkpoints)


# ---------------------------------------------------------------- the loop
def teacher_for(tr: Trainer, batch: dict) -> Teacher:
    d2t = tr.draft.d2t
    if "last_hidden" in batch:
        assert tr.lm_head is not None  # setup keeps the target's lm_head for a last-hidden teacher
        return teacher_from_hidden(
            batch["last_hidden"],
            tr.lm_head,
            d2t,
            loss_mask=batch["loss_mask"],
            target_argmax=batch.get("target_argmax"),  # stored by caches since 0.2: no full-vocab matmul
            compute_dtype=tr.autocast,
            spec=tr.logit_spec,  # the target's own distribution (Gemma-2 softcapping)
        )
    return teacher_from_topk(
        batch["topk_ids"], batch["topk_logprobs"], d2t, tr.draft.config.vocab_size, loss_mask=batch["loss_mask"]
    )


def stop_if_nonfinite(tr: Trainer, iv: Interval, norm: torch.Tensor | None = None) -> None:
    """Stop training at the first NaN/inf instead of training on into an all-NaN head: this optimizer
    step's losses and its gradient norm, checked before the update in ONE host read. Under DeepSpeed
    every rank must agree to stop (one rank raising alone would hang the others in the next
    collective), so the verdict is all-reduced."""
    values = [x.float().reshape(()) for x in iv.losses]
    if norm is not None:
        values.append(torch.as_tensor(norm).detach().float().reshape(()).to(tr.device))
    iv.losses, batches, iv.batches = [], iv.batches, []
    if not values:
        return
    vals = torch.stack([v.to(tr.device) for v in values])
    bad = (~torch.isfinite(vals)).any().float().view(1)
    if tr.world > 1:
        import torch.distributed as dist

        dist.all_reduce(bad)
    host = torch.cat([bad, vals]).tolist()  # the step's one device read
    if not host[0]:
        return
    first = next((j for j, v in enumerate(host[1:]) if not math.isfinite(v)), -1)
    mine, is_loss = first >= 0, 0 <= first < len(batches)
    what = "the loss" if is_loss else "the gradient norm" if mine else "a loss or the gradient norm"
    indices = batches[first] if is_loss else None
    where = f"optimizer step {tr.loop.step + 1} (epoch {tr.loop.epoch}, batch {tr.loop.batch_pos} of the epoch's plan"
    if indices is not None:
        describe = getattr(tr.source, "describe", None)
        where += f"; {describe(indices) if describe else f'samples {indices[:16]}'}"
    where += ")" if mine else ", on another rank)"
    shown = f"{host[1 + first]}" if mine else "not finite"
    last = ckpt.latest(tr.train_dir)
    raise StageError(
        f"training stopped: {what} is {shown} at {where}",
        "finite losses and gradients",
        (
            "check the target's features (a bf16 overflow? --dtype fp32) or lower --lr; "
            if tr.cfg.online
            else f"check the cache (eagle3 cache --verify {tr.cfg.cache or tr.run_dir / 'cache'}) or lower --lr; "
        )
        + (
            f"the last good checkpoint ({last.name}) is kept and a rerun resumes from it"
            if last
            else "no checkpoint yet"
        ),
    )


def with_noise(aux: torch.Tensor, scale: float, width: int) -> torch.Tensor:
    """aux + N(0, (scale * rms)^2), the RMS taken per token and per aux layer (each `width` wide:
    the layers' scales differ by orders of magnitude). Drawn from torch's global RNG, which
    checkpoints save, so a resumed run draws the same noise."""
    parts = aux.unflatten(-1, (-1, width))
    rms = parts.float().pow(2).mean(-1, keepdim=True).sqrt()
    noisy = parts + (torch.randn_like(parts, dtype=torch.float32) * rms * scale).to(parts.dtype)
    return noisy.flatten(-2)


def micro_step(tr: Trainer, ready: Ready, interval: Interval, last: bool) -> None:
    """One micro-batch forward and backward, with no host read of a device tensor (the step's losses
    are checked once, before the update: `stop_if_nonfinite`)."""
    batch = {k: v.to(tr.device, non_blocking=True) for k, v in ready.batch.items()}
    teacher = teacher_for(tr, batch)
    batch["aux_hidden"] = batch["aux_hidden"].to(tr.draft.fc.weight.dtype)
    if tr.cfg.feature_noise > 0:
        batch["aux_hidden"] = with_noise(batch["aux_hidden"], tr.cfg.feature_noise, tr.draft.config.target_hidden_size)
    with torch.autocast(tr.device.type, dtype=tr.autocast, enabled=tr.autocast is not None):
        out = tr.loss_fn(tr.model, batch, teacher, tr.cfg.ttt_steps, tr.cfg.step_weight, tr.cfg.loss)
    interval.add(out, ready)
    if tr.deepspeed:
        tr.model.backward(out.loss)  # the engine scales by its gradient_accumulation_steps
        if last:  # the engine updates the weights at this step(): the step's losses are checked first
            stop_if_nonfinite(tr, interval)
        tr.model.step()
    else:
        (out.loss / tr.cfg.grad_accum).backward()


def optimizer_step(tr: Trainer, interval: Interval) -> None:
    if tr.deepspeed:
        norm = tr.model.get_global_grad_norm()  # a host float: DeepSpeed reads it at its own step
        if norm is not None:
            stop_if_nonfinite(tr, interval, torch.as_tensor(float(norm)))
        interval.add_norm(norm if norm is not None else 0.0)
    else:
        params = [p for p in tr.draft.parameters() if p.requires_grad]
        if tr.cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, tr.cfg.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        # before the update: a NaN loss or gradient must not reach the weights (nor the next checkpoint)
        stop_if_nonfinite(tr, interval, norm)
        interval.add_norm(norm)
        tr.optimizer.step()
        tr.scheduler.step()
        tr.optimizer.zero_grad(set_to_none=True)
    tr.loop.step += 1
    interval.steps += 1


def measure_heldout(tr: Trainer) -> dict:
    """The learning curve's next point (train/heldout.py), under the keys metrics.jsonl and the curve
    keep (`heldout_*`)."""
    h = heldout_acceptance(tr, tr.heldout, tr.cfg.heldout_depth, teacher_for)
    point = {
        "heldout_tau": h["tau"],
        "heldout_alpha_k": h["alpha_k"],
        "heldout_samples": h["samples"],
        "heldout_anchors": h["anchors"],
        "heldout_depth": tr.cfg.heldout_depth,
    }
    return point


def starting_point(tr: Trainer) -> None:
    """--init-head: the learning curve's point at step 0, the head as it came (what the run adds is
    measured on the same held-out conversations)."""
    m = {"step": 0, "epoch": 0, "tokens": 0, "tokens_seen": 0, "train_seconds": 0.0, "train_cpu_seconds": 0.0}
    m.update(measure_heldout(tr))
    tr.model.train()
    if tr.rank == 0:
        ckpt.append_metrics(tr.train_dir / "metrics.jsonl", m)
        console.log(f"  held-out ({m['heldout_samples']} conversations): tau {m['heldout_tau']:.3f} at depth "
                    f"{m['heldout_depth']} before training (--init-head {tr.cfg.init_head})")  # fmt: skip


def learning_curve(tr: Trainer) -> list[dict]:
    """[{tokens, steps, seconds, heldout_tau, heldout_alpha_k, heldout_depth}] from metrics.jsonl."""
    return [
        {
            "tokens": m["tokens_seen"],
            "steps": m["step"],
            "seconds": m.get("train_seconds", 0.0),
            "cpu_seconds": m.get("train_cpu_seconds", 0.0),
            "heldout_tau": m["heldout_tau"],
            "heldout_alpha_k": m.get("heldout_alpha_k"),
            "heldout_depth": m.get("heldout_depth", 8),
        }
        for m in ckpt.read_metrics(tr.train_dir / "metrics.jsonl")
        if "heldout_tau" in m
    ]


def log_interval(tr: Trainer, iv: Interval, heldout: bool = False) -> dict:
    assert iv.sums is not None and iv.step_loss is not None and iv.loss is not None, "logged after micro-steps"
    dev = iv.sums.device
    gnorm_sum = iv.grad_norm.to(dev) if iv.grad_norm is not None else torch.zeros((), dtype=torch.float64, device=dev)
    counts = torch.tensor([iv.micro, iv.tokens], dtype=torch.float64, device=dev)
    packed = torch.cat([iv.sums.flatten().double(), iv.step_loss.double(), iv.loss.view(1), counts, gnorm_sum.view(1)])
    if tr.world > 1:
        import torch.distributed as dist

        dist.all_reduce(packed)
    packed = packed.cpu()  # the interval's one device read
    k = iv.sums.shape[1]
    sums = packed[: 4 * k].view(4, k).float()
    step_loss = packed[4 * k : 5 * k].float()
    loss, micro, tokens, gnorm = packed[5 * k :].tolist()
    if tr.world > 1:
        gnorm /= tr.world  # every rank saw the same global norm
    acc = accuracies(sums[0], sums[1])
    elapsed = max(1e-9, time.time() - iv.started)
    tr.loop.tokens_seen += int(tokens)
    m = {
        "step": tr.loop.step,
        "epoch": tr.loop.epoch,
        "lr": tr.scheduler.get_last_lr()[0],
        "loss": loss / micro,
        "loss_k": [round(float(x) / micro, 6) for x in step_loss],
        "acc_k": [round(a, 5) for a in acc],
        "alpha_k": [round(a, 5) for a in conditional_acceptance(sums[2], sums[3])],
        "sim_accept_len": round(simulated_accept_length(acc), 4),
        "sim_tau": round(simulated_tau(acc), 4),  # the same estimate as a tau: the bonus token included
        "grad_norm": gnorm / max(1, iv.steps),
        "tokens": int(tokens),
        "tok_per_s": round(tokens / elapsed, 1),
        "tokens_seen": tr.loop.tokens_seen,
        "train_seconds": round(tr.loop.train_seconds, 2),
        "train_cpu_seconds": round(tr.loop.train_cpu_seconds, 2),
    }
    # this rank's resident set: on CPU it grows while glibc's heap fragments (docs/troubleshooting.md)
    m["rss_mib"] = round(psutil.Process().memory_info().rss / 2**20)
    if heldout:
        m.update(measure_heldout(tr))
    tr.loop.metrics = m
    if tr.rank == 0:
        try:
            ckpt.append_metrics(tr.train_dir / "metrics.jsonl", m)
        except OSError as e:  # name the file (os.write errors carry none); cli turns it into exit 2
            raise OSError(e.errno, e.strerror, str(tr.train_dir / "metrics.jsonl")) from e
        if tr.tb is not None:
            for key in ("loss", "sim_accept_len", "lr", "grad_norm", "tok_per_s"):
                tr.tb.add_scalar(f"train/{key}", m[key], tr.loop.step)
            for k, (lk, ak) in enumerate(zip(m["loss_k"], m["acc_k"], strict=True)):
                tr.tb.add_scalar(f"loss_k/{k}", lk, tr.loop.step)
                tr.tb.add_scalar(f"acc_k/{k}", ak, tr.loop.step)
            tr.tb.flush()
        last = f" acc{len(acc) - 1} {acc[-1]:.3f}" if len(acc) > 1 else ""  # (--ttt-steps 1: one step)
        console.log(
            f"step {tr.loop.step}{'' if tr.cfg.time_budget_s else f'/{tr.total_steps}'} ep {tr.loop.epoch} loss {m['loss']:.4f} "
            # tau as eval and the held-out pass define it (tokens per target pass: accepted + the
            # bonus token), estimated from this batch's teacher-forced acc_k over the K TTT steps
            f"acc0 {acc[0]:.3f}{last} train-tau@{len(acc)} {1 + m['sim_accept_len']:.3f} "
            f"lr {m['lr']:.2e} {m['tok_per_s']:,.0f} tok/s"
        )
        if heldout:
            a = " ".join(f"{x:.2f}" for x in m["heldout_alpha_k"])
            console.log(
                f"  held-out ({m['heldout_samples']} conversations): tau {m['heldout_tau']:.3f} at depth "
                f"{m['heldout_depth']} (alpha_k {a}) after {tr.loop.tokens_seen:,} tokens, {tr.loop.train_seconds:,.0f} s"
            )
            plot_curve(
                tr.train_dir / "learning_curve.png",
                learning_curve(tr),
                f"learning curve: {tr.run_dir.name} (held-out chain tau)",
            )
    return m


def next_step_batches(tr: Trainer, plan: list[list[int]], pos: int | None = None) -> list[list[int]] | None:
    """This rank's micro-batches for the optimizer step at `pos` (default: the next one), or None at
    the end of the epoch."""
    pos = tr.loop.batch_pos if pos is None else pos
    per_step = tr.world * tr.cfg.grad_accum
    if pos + per_step > len(plan):
        return None  # the epoch's last few batches do not fill a step on every rank: dropped
    group = plan[pos : pos + per_step]
    return group[tr.rank * tr.cfg.grad_accum : (tr.rank + 1) * tr.cfg.grad_accum]


def epoch_feed(tr: Trainer, plan: list[list[int]]) -> Prefetch:
    """The rest of this epoch's micro-batches for this rank, read ahead (`--prefetch`)."""

    def order():
        # no batch past the run's last step: an --online batch is a target forward, wasted if never trained on
        pos, steps = tr.loop.batch_pos, tr.loop.step
        while steps < tr.total_steps and (mine := next_step_batches(tr, plan, pos)) is not None:
            yield from mine
            pos, steps = pos + tr.world * tr.cfg.grad_accum, steps + 1

    pin = tr.device.type == "cuda"  # pinned host memory: the copy to the GPU runs asynchronously
    # a split target's forward is a collective of every rank: made in the loop's own thread, in the plan's
    # order, never beside DeepSpeed's collectives in a reading thread
    ahead = 0 if getattr(tr.source, "sharded", False) else tr.cfg.prefetch
    return Prefetch(lambda indices: prepare(tr.source, indices, tr.cfg.max_length, pin), order(), ahead)


def fit(tr: Trainer) -> None:
    cfg = tr.cfg
    tr.train_dir.mkdir(parents=True, exist_ok=True)
    tr.model.train()
    iv = Interval()
    saved = -1
    plan = plan_for(cfg, tr.source.lengths, tr.loop.epoch, exclude=tr.unused)
    total = None if cfg.time_budget_s is not None else tr.total_steps  # a time budget: steps are not known
    if cfg.init_head is not None and tr.heldout and tr.loop.step == 0 and not learning_curve(tr):
        starting_point(tr)
    feed = epoch_feed(tr, plan)
    try:
        with console.progress("train", total=total, unit="step", completed=tr.loop.step) as bar:
            while tr.loop.step < tr.total_steps and not tr.out_of_time():
                mine = next_step_batches(tr, plan)
                if mine is None:
                    if tr.loop.epoch + 1 >= cfg.epochs and cfg.max_steps is None and cfg.time_budget_s is None:
                        break
                    tr.loop.epoch, tr.loop.batch_pos = tr.loop.epoch + 1, 0
                    plan = plan_for(cfg, tr.source.lengths, tr.loop.epoch, exclude=tr.unused)
                    feed.close()
                    feed = epoch_feed(tr, plan)
                    continue
                before, started, cpu = iv.tokens, time.time(), time.process_time()
                compiling = getattr(tr.loss_fn, "compiles_next", False)  # a one-off cost, not the recipe's
                # A compiled step runs with the reading thread paused (`Prefetch.paused`) when that thread
                # runs model code too (--online), or when the step is traced: its batches in hand first.
                if compiling or (cfg.compile and cfg.online):
                    ready = [feed.take(indices) for indices in mine]
                    with feed.paused():
                        for j, r in enumerate(ready):
                            micro_step(tr, r, iv, last=j == len(ready) - 1)
                else:
                    for j, indices in enumerate(mine):
                        micro_step(tr, feed.take(indices), iv, last=j == len(mine) - 1)
                optimizer_step(tr, iv)
                tr.loop.batch_pos += tr.world * cfg.grad_accum
                if not compiling:
                    tr.loop.train_seconds += time.time() - started
                    tr.loop.train_cpu_seconds += time.process_time() - cpu
                bar.advance(1, tokens=iv.tokens - before)
                last = tr.loop.step == tr.total_steps or tr.out_of_time()
                measure = bool(tr.heldout) and (tr.loop.step % cfg.heldout_every == 0 or last)
                best = False
                if tr.loop.step % cfg.log_every == 0 or last or measure:
                    best = new_best(tr, log_interval(tr, iv, heldout=measure))
                    iv = Interval()
                if tr.loop.step % cfg.save_every == 0 or best:  # a new best is kept off the cadence too
                    save_checkpoint(tr, best)
                    saved = tr.loop.step
    finally:
        feed.close()
    best = bool(iv.steps) and new_best(tr, log_interval(tr, iv, heldout=bool(tr.heldout)))
    if tr.out_of_time():
        tr.stopped = f"spent the time budget ({cfg.time_budget_s:,.0f} {cfg.time_clock} s of training) after {tr.loop.step} steps"
    elif tr.loop.step >= tr.total_steps:
        tr.stopped = f"reached {tr.total_steps} optimizer steps"
    else:
        tr.stopped = f"finished {cfg.epochs} epoch(s)"
    if (tr.loop.step % cfg.save_every or best) and saved != tr.loop.step:
        save_checkpoint(tr, best)


def keep_best(tr: Trainer) -> dict:
    """`--head-from best`: put the weights of the checkpoint with the highest held-out tau
    back into the draft when the last step's is lower (every rank: they measured the same tau).
    Returns what the manifest records of the choice; {} when nothing was measured."""
    last_tau = tr.loop.metrics.get("heldout_tau")
    if tr.loop.best_step < 0 or last_tau is None:
        return {}
    kept = {"exported_step": tr.loop.step, "exported_heldout_tau": last_tau, "last_step": tr.loop.step,
            "last_heldout_tau": last_tau, "best_step": tr.loop.best_step, "best_heldout_tau": tr.loop.best}  # fmt: skip
    if tr.cfg.head_from == "last" or tr.loop.best_step == tr.loop.step or not tr.loop.best > last_tau:
        return kept
    link = tr.train_dir / ckpt.CKPT_DIR / "best"
    if not link.resolve().is_file():
        if tr.rank == 0:
            console.warn(f"{link} is gone: exporting the last step's weights (held-out tau {last_tau:.3f})")
        return kept
    state = ckpt.load(link.resolve())
    if tr.deepspeed:
        ckpt.load_deepspeed(tr.model, tr.train_dir / "deepspeed", state["ds_tag"])
    else:
        ckpt.restore(link.resolve(), state, tr.draft, tr.optimizer, tr.scheduler)  # checked as a resume is
    if tr.rank == 0:
        console.log(f"exporting step {tr.loop.best_step}'s weights: held-out tau {tr.loop.best:.3f}, above the last "
                    f"step's {last_tau:.3f} (--head-from last exports the last)")  # fmt: skip
    return kept | {"exported_step": tr.loop.best_step, "exported_heldout_tau": tr.loop.best}


def finish(tr: Trainer) -> Path:
    """Export the head (rank 0), check it reloads to the same logits, write the train manifest."""
    summary = {
        "steps": tr.loop.step,
        "epochs": tr.loop.epoch + 1,
        "tokens_seen": tr.loop.tokens_seen,
        "stopped": tr.stopped,
        "ttt_steps": tr.cfg.ttt_steps,
        "final_metrics": tr.loop.metrics,
    }
    summary |= keep_best(tr)
    draft = tr.draft
    if tr.deepspeed:
        from .launch import gathered_copy

        # Every rank takes part in the gather; rank 0 then exports and self-checks a plain copy that
        # DeepSpeed does not manage (a ZeRO-3 module's forward would start collectives on rank 0 alone).
        draft = gathered_copy(tr.model, tr.draft, keep=tr.rank == 0)
    if tr.rank == 0:
        export = draft.float() if draft.fc.weight.dtype != torch.float32 else draft
        bad = nonfinite_tensors(export.state_dict())
        if bad:
            raise StageError(
                f"the trained head has non-finite values in {', '.join(bad[:6])}: not exported",
                "finite weights",
                f"start over with a lower --lr: eagle3 train --run {tr.run_dir} --no-resume",
            )
        save_head(export, tr.head_dir, tr.identity, {"training": summary})
        diff, bound = self_check(export, tr.head_dir)
        if not diff <= bound:  # written so that a NaN difference fails too
            raise StageError(
                f"exported head reproduces the trained logits only to {diff:.2e}",
                f"a lossless export (< {bound:.1e} at this dtype and matmul precision)",
            )
        source: dict[str, Any] = (
            {"cache": str(tr.cfg.cache or tr.run_dir / "cache")}
            if not tr.cfg.online
            else {"data": str(tr.cfg.data or tr.run_dir / "data")}
            | ({"extra_data": list(tr.cfg.extra_data)} if tr.cfg.extra_data else {})
        )
        cache_manifest = Path(source.get("cache", "")) / "manifest.json"
        unused = set(tr.unused)
        write_manifest(
            tr.train_dir,
            "train",
            config=config_dict(tr.cfg),
            target=tr.identity,
            aux_layer_ids=list(draft.config.aux_layer_ids),
            draft_vocab_size=draft.config.draft_vocab_size,
            input=source | ({"cache_manifest_sha256": sha256_file(cache_manifest)} if cache_manifest.is_file() else {}),
            head=str(tr.head_dir),
            input_fingerprint=tr.source.fingerprint,
            export_self_check_max_abs_diff=diff,
            world_size=tr.world,
            trained_samples=len(tr.source.lengths) - len(unused),
            trained_sample_tokens=sum(n for i, n in enumerate(tr.source.lengths) if i not in unused),
            **(
                {"trained_by_folder": folder_shares(tr.cfg, tr.run_dir, tr.source, unused)} if tr.cfg.extra_data else {}
            ),
            **summary,
        )
        atomic_write_json(tr.train_dir / "summary.json", summary)
        write_card(tr.head_dir, keep_evals=False)  # after the train manifest it reads; a new head's old evals go
        console.log(f"stopped: {tr.stopped}; head exported to {tr.head_dir} (self-check max |diff| {diff:.1e})")
    return tr.head_dir


def run_train(cfg: TrainConfig) -> Path:
    check_device(cfg.device)  # before any model loads (and before the lock)
    # One writer per run's train/ (and head/). The launcher holds the lock for its DeepSpeed ranks;
    # ranks started some other way (torchrun) lock from global rank 0.
    if os.environ.get("RANK", "0") != "0":
        return _run_train(cfg)
    claim_run_folders(cfg.run_dir)
    with stage_lock(cfg.run_dir / "train", "train"):
        for d in (cfg.run_dir / "train", cfg.run_dir / "train" / ckpt.CKPT_DIR, cfg.run_dir / "head"):
            remove_dead_temps(d)  # a checkpoint or head export cut by a kill: a full-size hidden file each
        return _run_train(cfg)


def claim_run_folders(run_dir: Path) -> None:
    """Before anything trains: RUN/train and RUN/head are train's to write (exit 2 otherwise, files
    kept). A head/ holding a user's config.json + model.safetensors (no manifest of ours), or a link
    out of the run to such a folder, was overwritten at the end of a run."""
    nxt = "move those files out of the way (or remove the link), or train in another run: --run runs/OTHER"
    refuse_link_out(run_dir / "train", "train", nxt, resumable=(f"{ckpt.CKPT_DIR}/*",))
    claim_output(run_dir / "head", "head", HEAD_FILES, marked=True, command="train", next_step=nxt)


def _run_train(cfg: TrainConfig) -> Path:
    if cfg.deepspeed is not None and not console.is_launched_rank():
        require("deepspeed", "--deepspeed")
        from .launch import launch

        return launch(cfg)
    tr = setup(cfg)
    if finished(tr):
        console.log(f"{tr.train_dir} already finished at step {tr.loop.step}; the head in {tr.head_dir} is intact")
        if tr.rank == 0 and not (tr.head_dir / CARD).exists():  # killed after the manifest, before the card
            write_card(tr.head_dir, keep_evals=False)
        return tr.head_dir
    fit(tr)
    if isinstance(tr.source, OnlineSource):  # no forward past the last step: the export gets its memory
        tr.source.release()
    return finish(tr)


def end_rank(code: int) -> None:
    """End a launched rank's process (`python -m eagle3cli`, as the DeepSpeed launcher starts
    ranks) without interpreter finalization; a no-op where no process group is up.

    Why: a finished rank could abort after its program ended ("terminate called without an
    active exception", SIGABRT; no Python frame left), failing the launch: a 2-rank ZeRO-3 script
    did so in 3 of 20 launches, and in 0 of 30 when it ended this way. What fits: DeepSpeed holds
    the gloo process group in module globals, so it outlives `destroy_process_group` and is freed
    while the interpreter shuts down. Every file a rank writes is already closed and renamed into
    place by now, so nothing is lost by skipping finalization."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if code == 0:
        dist.barrier()  # no rank leaves while another could still need it
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a failed rank leaves at once: the launcher stops the others


class FinishedTrain(TypedDict):
    """What a rerun reads of a finished train's manifest (`finished`)."""

    stage: str
    steps: int


def finished(tr: Trainer) -> bool:
    """A rerun of a completed run: nothing to train, and the exported head is the one its manifest
    lists (so it is not rewritten, and its final metrics stay as they were)."""
    if (tr.loop.step < tr.total_steps and not tr.out_of_time()) or not (tr.train_dir / "manifest.json").is_file():
        return False
    try:
        m, h = read_json(tr.train_dir / "manifest.json"), read_json(tr.head_dir / "manifest.json")
    except (OSError, ValueError):
        return False
    if schema_problems(h, StageManifest) or schema_problems(m, FinishedTrain):
        return False  # a hand-edited manifest: the head is exported again and the manifest rewritten
    shards = h.get("shards") or []
    return bool(shards) and m.get("steps") == tr.loop.step and not verify_shards(tr.head_dir, shards)
