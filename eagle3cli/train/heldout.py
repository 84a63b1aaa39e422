"""The learning curve: acceptance on held-out conversations while the head trains.

Every `--heldout-every` steps the draft is unrolled `--heldout-depth` steps (the TTT unroll, no
decoding) over cached conversations the training plan never contains, and scored as a greedy
chain would be: draft token k is accepted when it equals the target's argmax and tokens 0..k-1
were accepted. A position whose target argmax is outside the draft vocab is a rejection (a real
decoder cannot draft it), not a skipped anchor as in the training loss. When the data is the
target's own greedy text (gen-data at temperature 0), the tokens the unroll reads after an
accepted prefix are exactly what a chain decoder would feed, so this estimates `eagle3 eval`'s
greedy chain tau without a single target forward.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..speculate.acceptance import accept_lengths, chain_summary, walk_rounds
from ..speculate.sampling import generator_for
from .data import plan_for


def heldout_indices(n_samples: int, wanted: int) -> list[int]:
    """`wanted` sample indices spread evenly over the cache (at most a tenth of it), the same for
    every run on this cache; [] when the cache is too small to spare any."""
    k = min(wanted, n_samples // 10)
    return sorted({(j * n_samples) // k for j in range(k)}) if k > 0 else []


def unused_indices(n_samples: int, heldout: list[int], train_samples: int | None, skip: int = 0) -> list[int]:
    """Sample indices a run does not train on: the held-out ones, and with `train_samples` = N every
    sample outside the first N of one fixed order (a seeded permutation independent of --seed, so the
    subsets of a data-scaling curve are nested and share the held-out set). With `skip` = S the run
    takes the N after the first S instead (all after S when N is None): a continuation's new data."""
    if train_samples is None and not skip:
        return list(heldout)
    held = set(heldout)
    order = [i for i in range(n_samples) if i not in held]
    perm = torch.randperm(len(order), generator=generator_for("cpu", 20261202)).tolist()
    end = None if train_samples is None else skip + train_samples
    keep = {order[j] for j in perm[skip:end]}
    return sorted(i for i in range(n_samples) if i not in keep)


def unused_indices_in_folders(
    sizes: list[int], heldout: list[int], train_samples: int | None, skip: int = 0, joined_at: int = 0
) -> list[int]:
    """unused_indices over several gen-data folders whose samples are concatenated, --data's first (the
    held-out set lies in it). --data is windowed exactly as alone. Every other folder, in its own fixed
    order, takes the same share of its samples as the window takes of --data's trainable samples after
    `joined_at`: consecutive sessions take consecutive, disjoint shares (session k's end is session
    k+1's start, computed alike), and from `joined_at` to the end they cover each folder once."""
    first = unused_indices(sizes[0], heldout, train_samples, skip)
    if len(sizes) == 1:
        return first
    span = sizes[0] - len(heldout) - joined_at
    lo = (skip - joined_at) / span
    hi = 1.0 if train_samples is None else min(1.0, (skip + train_samples - joined_at) / span)
    out, offset = list(first), sizes[0]
    for n in sizes[1:]:
        perm = torch.randperm(n, generator=generator_for("cpu", 20261202)).tolist()
        keep = set(perm[round(lo * n) : round(hi * n)])
        out += [offset + i for i in range(n) if i not in keep]
        offset += n
    return out


@torch.no_grad()
def heldout_acceptance(tr, indices: list[int], depth: int, teacher_for) -> dict:
    """The chain summary of the draft on the held-out samples (every rank computes all of it:
    under ZeRO-3 each rank must run the same forwards)."""
    lengths = [tr.source.lengths[i] for i in indices]
    batches = plan_for(tr.cfg, lengths, 0, seed=0)
    draft = tr.model
    inner = getattr(draft, "module", draft)

    def logits(h: torch.Tensor) -> torch.Tensor:
        return inner.logits(h, module_calls=True)  # ZeRO-3: module calls gather the partitioned weights

    if tr.heldout_batches is not None and tr.source.online:
        made = tr.heldout_batches
    else:
        made = [tr.source.batch([indices[i] for i in b], tr.cfg.max_length) for b in batches]
        if tr.source.online:  # each would cost a target forward at every point of the curve: the set never changes
            tr.heldout_batches = made
    accepted = torch.zeros(depth, dtype=torch.float64)
    rounds = 0
    for made_batch in made:
        batch = {k: v.to(tr.device) for k, v in made_batch.items()}
        teacher = teacher_for(tr, batch)
        aux = batch["aux_hidden"].to(inner.fc.weight.dtype)
        with torch.autocast(tr.device.type, dtype=tr.autocast, enabled=tr.autocast is not None):
            hiddens = inner.ttt_unroll(batch["input_ids"], aux, depth)
            length = accept_lengths(hiddens, logits, teacher, batch["loss_mask"])
        a, r = walk_rounds(length.cpu(), batch["loss_mask"].cpu(), depth)
        accepted, rounds = accepted + a, rounds + r
    out = chain_summary(accepted, torch.full((depth,), float(rounds), dtype=torch.float64))
    out["samples"], out["anchors"] = len(indices), rounds
    return out


def _short(x: float, _pos=None) -> str:
    return f"{x / 1e6:.1f}M" if abs(x) >= 1e6 else f"{x / 1e3:.0f}k" if abs(x) >= 1e3 else f"{x:.0f}"


def plot_curve(path: Path, points: list[dict], title: str) -> None:
    """tau on held-out conversations against training tokens and against training wall time."""
    from ..extras import plotting

    if not points or not plotting():
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..run_folder.manifest import atomic_write

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    taus = [p["heldout_tau"] for p in points]
    for ax, key, label in ((axes[0], "tokens", "training tokens"), (axes[1], "seconds", "training wall time (s)")):
        ax.plot([p[key] for p in points], taus, marker="o")
        ax.set_xlabel(label)
        if key == "tokens":  # 1.2M, 300k: raw counts crowd the axis
            ax.xaxis.set_major_formatter(FuncFormatter(_short))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out tau (chain, depth {points[-1].get('heldout_depth', 8)})")
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
