"""Training batches: offline from a cache folder, or online from gen-data conversations.

Both sources expose `lengths` and `sample(i)`; `plan_epoch` turns lengths into a deterministic,
length-bucketed, token-budget batch plan for (seed, epoch), so the position in an epoch is just
(epoch, batch index) and a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UsageError
from ..readers.jsonl import read_records
from ..run_folder.manifest import folder_fingerprint, read_json
from ..speculate.vocab import build_mapping, select_draft_tokens, token_counts


def plan_epoch(
    lengths: list[int],
    token_budget: int,
    seed: int,
    epoch: int,
    max_batch_size: int = 256,
    bucket_factor: int = 50,
    exclude: list[int] | None = None,
    max_attention: int | None = None,
) -> list[list[int]]:
    """Batches of sample indices with (batch size x longest length) <= token_budget and, with
    `max_attention`, (batch size x longest length^2) <= max_attention: each TTT step keeps
    attention weights of B x heads x T^2 for the backward pass, which a token budget alone lets
    grow with T (a SmolLM2 run at T=2048 peaked at 15 GB). The indices in `exclude` (held-out
    samples) are in none of the batches.

    Samples are shuffled, then sorted by length within chunks of `bucket_factor` batches' worth of
    samples (length bucketing keeps padding low without a fixed length order), cut into batches,
    and the batches shuffled. Deterministic in (seed, epoch).
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    skip = set(exclude or ())
    order = [i for i in range(len(lengths)) if i not in skip]
    rng.shuffle(order)
    mean = max(1, sum(lengths) // max(1, len(lengths)))
    chunk = max(1, bucket_factor * max(1, token_budget // mean))
    batches: list[list[int]] = []
    for s in range(0, len(order), chunk):
        part = sorted(order[s : s + chunk], key=lambda i: lengths[i], reverse=True)
        cur: list[int] = []
        for i in part:
            longest = lengths[cur[0]] if cur else lengths[i]
            over_attention = max_attention is not None and (len(cur) + 1) * longest * longest > max_attention
            if cur and ((len(cur) + 1) * longest > token_budget or len(cur) >= max_batch_size or over_attention):
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def plan_for(cfg, lengths: list[int], epoch: int, exclude: list[int] | None = None, seed: int | None = None):
    """`plan_epoch` with a TrainConfig's batch limits (token budget, attention bound, batch size)."""
    return plan_epoch(
        lengths,
        cfg.token_budget,
        cfg.seed if seed is None else seed,
        epoch,
        cfg.max_batch_size,
        exclude=exclude,
        max_attention=cfg.max_attention,
    )


def collate(samples: list[dict], max_length: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples into a batch (pad id 0, loss_mask False, zero features).

    Right padding is safe for the causal draft: real positions never attend to later pads, and
    the loss mask is False there. `lengths` is kept for token counting.
    """
    if max_length:
        samples = [{k: v[:max_length] for k, v in s.items()} for s in samples]
    width = max(len(s["input_ids"]) for s in samples)
    out: dict[str, torch.Tensor] = {}
    for key in samples[0]:
        rows = []
        for s in samples:
            x = s[key]
            pad = width - x.shape[0]
            if pad:
                x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
            rows.append(x)
        out[key] = torch.stack(rows)
    out["lengths"] = torch.tensor([len(s["input_ids"]) for s in samples])
    return out


READING = threading.Lock()  # a source is read by the prefetch thread and by the loop's held-out pass


class CacheSource:
    """Offline: a `runs/NAME/cache/` folder through CacheReader."""

    online = False

    def __init__(self, cache_dir: Path):
        from ..cache import CacheReader

        self.reader = CacheReader(cache_dir)
        self.lengths = list(self.reader.lengths)
        self.d2t, self.t2d = self.reader.d2t, self.reader.t2d
        self.aux_layer_ids = tuple(self.reader.aux_layer_ids)
        self.target = self.reader.target
        self.teacher = self.reader.teacher
        self.fingerprint = folder_fingerprint(self.reader.manifest)  # a resume checks it is the same cache
        if not self.lengths:
            raise UsageError(
                f"cache {cache_dir} holds no samples",
                "a cache with at least one sample",
                "eagle3 cache --run runs/NAME",
            )

    def narrow_vocab(self, size: int) -> None:
        """Train a smaller draft vocab than the cache's: its `size` most frequent assistant tokens,
        chosen from the cache's own counts exactly as `eagle3 cache --draft-vocab-size size` would
        choose them (a subset of the cache's vocab, so every teacher row is still computable)."""
        have, counts, cache = len(self.d2t), self.reader.token_counts, self.reader.dir
        rebuild = f"eagle3 cache --run {cache.parent} --draft-vocab-size {size}   (into a new run folder)"
        if size > have:
            raise UsageError(
                f"--draft-vocab-size {size} is larger than the cache's draft vocab ({have}, {cache})",
                f"at most {have}, or a cache built with the larger vocab",
                rebuild,
            )
        if size == have:
            return
        if counts is None:
            raise UsageError(
                f"cache {cache} has no token counts to choose a {size}-token draft vocab from",
                "a cache written by `eagle3 cache` (its vocab.safetensors holds token_counts)",
                rebuild,
            )
        self.d2t, self.t2d = build_mapping(select_draft_tokens(counts, size), counts.numel())

    def batch(self, indices: list[int], max_length: int | None) -> dict[str, torch.Tensor]:
        with READING:  # the prefetch thread and the held-out pass share the reader's open shards
            rows = [self.reader[i] for i in indices]
        return collate(rows, max_length)

    def describe(self, indices: list[int]) -> str:
        shown = ", ".join(self.reader.where(i) for i in indices[:4])
        return f"samples {shown}" + (f" and {len(indices) - 4} more" if len(indices) > 4 else "")


def read_conversations(data_dir: Path) -> list[dict]:
    """The records of a gen-data folder, in shard order (the manifest must exist: a finished stage)."""
    from ..run_folder.manifest import contained, read_manifest

    m = read_manifest(data_dir, "gen-data", "eagle3 gen-data --target TARGET --input FILE --run runs/NAME")
    records = []
    for s in m["shards"]:
        records += read_records(contained(data_dir, s["file"]))
    return records


def online_samples(data_dir: Path, tokenizer, max_length: int) -> list[tuple[list[int], list[bool]]]:
    """(input_ids, loss_mask) of every sample --online trains on, in order: exactly the cache's samples
    (per-turn reasoning samples, cut turns; template refusals and samples with no loss token skipped).
    benchmarks/stages/data_scaling.py counts a corpus's samples with it."""
    from ..cache import mask_data_record
    from ..model.chat import TemplateRefusal

    samples = []
    for r in read_conversations(data_dir):
        try:
            masked = mask_data_record(tokenizer, r, max_length)
        except TemplateRefusal:
            continue
        samples += [(ms.input_ids, ms.loss_mask) for ms in masked if any(ms.loss_mask)]
    return samples


class OnlineSource:
    """Online: tokenise gen-data conversations with the cache stage's masks and run the target
    in-process per batch (no cache on disk; features cost one target forward per batch)."""

    online = True

    def __init__(
        self,
        data_dirs: list[Path],
        target_model,
        tokenizer,
        aux_layer_ids: tuple[int, ...],
        draft_vocab_size: int,
        max_length: int,
        sharded: bool = False,
    ):
        self.model, self.aux_layer_ids = target_model, tuple(aux_layer_ids)
        # the target split over the ranks (`model/sharded.py`): every rank enters each forward together
        self.sharded = sharded
        # --data first, then each --extra-data folder: one fingerprint, the first folder's alone as before
        prints = [folder_fingerprint(read_json(Path(d) / "manifest.json")) for d in data_dirs]
        self.fingerprint = "+".join(prints)
        self.samples: list[tuple[list[int], list[bool]]] = []
        self.folder_sizes: list[int] = []
        for d in data_dirs:
            samples = online_samples(d, tokenizer, max_length)
            if not samples:
                raise UsageError(
                    f"{d} has no conversation with an assistant turn",
                    "gen-data output",
                    "eagle3 gen-data ... --run runs/NAME",
                )
            self.samples += samples
            self.folder_sizes.append(len(samples))
        vocab = target_model.config.vocab_size
        if draft_vocab_size > vocab:  # as the cache does: the default 32000 must not refuse a small target
            from ..console import warn

            warn(f"--draft-vocab-size {draft_vocab_size} exceeds the target vocab {vocab}: capped")
            draft_vocab_size = vocab
        self.d2t, self.t2d = build_mapping(
            select_draft_tokens(token_counts(self.samples, vocab), draft_vocab_size), vocab
        )
        self.lengths = [len(ids) for ids, _ in self.samples]
        self.teacher = "last_hidden"
        self.target = None

    def release(self) -> None:
        """Drop the target (training is over): a target split to fit beside the head left too little
        room for the head's export copy (a 1.2B target under a 4.5 GB cap per rank failed there)."""
        import gc

        self.model = None
        gc.collect()

    def _collate(self, indices: list[int], max_length: int | None) -> dict[str, torch.Tensor]:
        rows = [
            {"input_ids": torch.tensor(self.samples[i][0]), "loss_mask": torch.tensor(self.samples[i][1])}
            for i in indices
        ]
        return collate(rows, max_length)

    @torch.no_grad()
    def batch(self, indices: list[int], max_length: int | None) -> dict[str, torch.Tensor]:
        from ..speculate.target import capture_features

        b = self._collate(indices, max_length)
        run, start = list(indices), 0
        if self.sharded:
            # the split target runs the ranks' micro-batches as one batch, each rank keeping its rows (the
            # held-out pass asks every rank for the same samples: those run once)
            import torch.distributed as dist

            from ..model.sharded import gather

            everyone = gather(list(indices))
            if any(x != everyone[0] for x in everyone):
                run = [i for x in everyone for i in x]
                start = sum(len(x) for x in everyone[: dist.get_rank()])
        whole = b if run == list(indices) else self._collate(run, max_length)
        device = next(self.model.parameters()).device
        att = (torch.arange(whole["input_ids"].shape[1])[None] < whole["lengths"][:, None]).long()
        with READING:  # one capture at a time: its hooks are on the one target model
            aux, last = capture_features(self.model, whole["input_ids"].to(device), att.to(device), self.aux_layer_ids)
        rows, width = slice(start, start + len(indices)), b["input_ids"].shape[1]
        # stay on the target's device
        b["aux_hidden"], b["last_hidden"] = aux[rows, :width].float(), last[rows, :width].float()
        return b


# ---------------------------------------------------------------- batches read ahead of the step
@dataclass
class Ready:
    """One micro-batch as the step takes it: its samples, its tensors (host memory, pinned for an
    asynchronous copy when training on CUDA; --online's features are already on the target's
    device) and its token count, counted on the host so the step needs no device read for it."""

    indices: list[int]
    batch: dict[str, torch.Tensor]
    tokens: int


def prepare(source, indices: list[int], max_length: int | None, pin: bool) -> Ready:
    batch = source.batch(indices, max_length)
    tokens = int(batch["lengths"].sum())  # a host tensor: collate builds lengths on the CPU
    if pin:
        batch = {k: v.pin_memory() if v.device.type == "cpu" else v for k, v in batch.items()}
    return Ready(indices, batch, tokens)


class Prefetch:
    """The micro-batches of `order`, read `ahead` at a time in a background thread, so cache reads and
    fp8 decoding overlap the step instead of stalling the device between steps. `take(indices)` gives
    them back in order; the batches are exactly those `prepare` makes in the loop (ahead 0)."""

    def __init__(self, make: Callable[[list[int]], Ready], order: Iterator[list[int]], ahead: int):
        self.make, self.ahead = make, ahead
        self.order = order
        self.queue: queue.Queue = queue.Queue(maxsize=max(ahead, 1))
        self.stop = threading.Event()
        self.busy = threading.Lock()  # held while a batch is made: `paused()` waits for it
        self.thread = None
        if ahead > 0:
            self.thread = threading.Thread(target=self._fill, name="eagle3-prefetch", daemon=True)
            self.thread.start()

    def _fill(self) -> None:
        try:
            for indices in self.order:
                if self.stop.is_set():
                    return
                with self.busy:
                    item = self.make(indices)
                self._put(item)
        except BaseException as e:  # noqa: BLE001 — handed to the loop, which raises it where it waits
            self._put(e)

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def take(self, indices: list[int]) -> Ready:
        if self.thread is None:
            return self.make(indices)
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        assert item.indices == indices, "prefetched micro-batches follow the plan"
        return item

    @contextlib.contextmanager
    def paused(self):
        """No batch is made while this is held. torch.compile traces the step under it: an online
        source runs the target in the reading thread, and dynamo's trace, replayed on restart, diverged
        when that thread ran model code meanwhile (a resumed `--online --compile` run failed so)."""
        with self.busy:
            yield

    def close(self) -> None:
        """Stop reading ahead (the loop ended, or the epoch did); waits for a batch being read."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
