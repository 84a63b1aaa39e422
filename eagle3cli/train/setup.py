"""`setup(cfg)`: everything `eagle3 train` needs before its first step, checked.

The inputs (a cache, or RUN/data with the target run in-process), the target's embeddings,
lm_head and final norm the draft starts from, the aux layers, the optimizer and warmup-cosine
schedule, DeepSpeed's engine under the launcher, and the resume from the last checkpoint (refused
when its settings differ from this command's).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import console
from ..config import config_dict
from ..errors import UsageError
from ..head.read import init_draft_from_weights
from ..model.target import open_target, pick_device, pick_dtype
from ..run_folder.manifest import check_matches, check_schema, read_json, read_manifest
from ..speculate.aux_layers import (
    EXPECTED,
    aux_layer_problems,
    default_aux_layer_ids,
    named_aux_layer_ids,
    parse_aux_layers,
)
from ..speculate.draft import Eagle3Draft, draft_config_from_target
from ..speculate.target import LogitSpec, final_norm_offset, logit_spec, text_config
from ..speculate.ttt import TTTOutput, compiled_ttt_loss, draft_ttt_loss
from ..speculate.vocab import map_problems
from . import checkpoint as ckpt
from .config import ONLINE_DRAFT_VOCAB, TrainConfig, upgrade_recorded
from .data import CacheSource, OnlineSource, plan_for
from .heldout import heldout_indices, unused_indices_in_folders
from .optim import apply_init, build_optimizer

CACHE_NEXT = "eagle3 cache --run runs/NAME"


# ---------------------------------------------------------------- target pieces
def load_target_weights(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, {embed, lm_head, norm}) read straight from the safetensors: training needs
    only these three tensors of the target, not its decoder layers."""
    from safetensors import safe_open

    cfg = text_config(read_json(path / "config.json"))
    index = path / "model.safetensors.index.json"
    files = read_json(index)["weight_map"] if index.exists() else None
    wanted = {"embed": "model.embed_tokens.weight", "lm_head": "lm_head.weight", "norm": "model.norm.weight"}
    if cfg.get("tie_word_embeddings"):
        wanted["lm_head"] = wanted["embed"]
    out = {}
    for key, name in wanted.items():
        f = path / (files[name] if files and name in files else "model.safetensors")
        try:
            # pread: only these tensors are read (a copy-on-write mmap charges the whole file to this process)
            with safe_open(str(f), framework="pt", backend="pread") as h:
                out[key] = h.get_tensor(name).float()
        except Exception as e:  # missing file or tensor: not a Llama-style checkpoint
            raise UsageError(
                f"cannot read {name} from {f} ({type(e).__name__}: {e})",
                "a Llama-style safetensors checkpoint (model.embed_tokens, lm_head, model.norm)",
            ) from e
    return cfg, out


def choose_aux_ids(choice: str, n_layers: int, cache_ids: tuple[int, ...] | None) -> tuple[int, ...]:
    """The aux layers `--aux-layers` names (cache, default, top or ids), checked by the one rule
    (`speculate.aux_layers.aux_layer_problems`) and against what the cache holds."""
    named = named_aux_layer_ids(parse_aux_layers(choice), n_layers)  # validate() refused any other spelling
    if named is None:  # cache
        ids = default_aux_layer_ids(n_layers) if cache_ids is None else tuple(cache_ids)
        errors = aux_layer_problems(ids, n_layers)
        if errors:
            raise UsageError(
                f"the cache's aux layers: {errors[0]}", EXPECTED, "eagle3 cache --run runs/NAME --aux-layers 2,L//2,L-3"
            )
        return ids
    ids = named
    errors = aux_layer_problems(ids, n_layers)
    if errors:
        raise UsageError(f"--aux-layers: {errors[0]}", f"ids in 1..{n_layers - 1}")
    if cache_ids is not None and tuple(cache_ids) != tuple(ids):
        raise UsageError(
            f"--aux-layers {choice} means layers {list(ids)}, but the cache holds features of layers {list(cache_ids)}",
            "a cache built with the same aux layers",
            f"eagle3 cache --run runs/NAME --aux-layers {','.join(map(str, ids))}   (into another run folder)",
        )
    return tuple(ids)


# ---------------------------------------------------------------- the trainer
@dataclass
class LoopState:
    """Where training is: all a checkpoint records of the loop besides tensors, rng and settings,
    saved as `asdict` under these very names (the checkpoint's keys) and restored in place (the
    time-budget schedule reads the clock from this object)."""

    step: int = 0
    epoch: int = 0
    batch_pos: int = 0  # batches of the current epoch's plan already consumed (all ranks)
    best: float = -1.0  # the highest held-out tau so far (the `best` checkpoint); -1: none measured
    best_step: int = -1  # the step it was measured at
    tokens_seen: int = 0
    train_seconds: float = 0.0  # wall time over every session
    train_cpu_seconds: float = 0.0  # this process's core-seconds: what a busy shared machine does not inflate
    metrics: dict = field(default_factory=dict)  # the last metrics line (a finished run re-exported keeps it)

    def checkpoint(self) -> dict:
        return dataclasses.asdict(self)

    def restore(self, state: dict) -> None:
        """From a checkpoint's state; older checkpoints lack the clock (0) and the metrics ({})."""
        for f in dataclasses.fields(self):
            if f.name in state:
                setattr(self, f.name, state[f.name])
        self.train_seconds, self.train_cpu_seconds = float(self.train_seconds), float(self.train_cpu_seconds)
        self.metrics = dict(self.metrics or {})
        if "best_step" not in state:  # older checkpoints' `best` was a training-batch estimate, not held-out tau
            self.best, self.best_step = -1.0, -1


@dataclass(frozen=True)
class Clock:
    """Training time so far, wall and CPU, as read from a `LoopState`."""

    seconds: float
    cpu_seconds: float


@dataclass
class Trainer:
    """The objects training is built from (`setup`), and the loop's state (`loop`, checkpointed)."""

    cfg: TrainConfig
    run_dir: Path
    train_dir: Path
    head_dir: Path
    source: CacheSource | OnlineSource
    draft: Eagle3Draft
    model: Any  # the draft, or the DeepSpeed engine wrapping it (deepspeed ships no types)
    optimizer: Any  # torch.optim.AdamW, or train.optim.OptimizerPair with --optimizer muon
    scheduler: Any  # LambdaLR, or train.optim.SchedulerPair
    lm_head: torch.Tensor | None
    device: torch.device
    autocast: torch.dtype | None
    identity: dict
    total_steps: int
    rank: int = 0
    world: int = 1
    deepspeed: bool = False
    loop: LoopState = field(default_factory=LoopState)
    stopped: str = ""  # why the loop ended (said in the log and the summary)
    tb: Any = None  # TensorBoard SummaryWriter on rank 0 with --tensorboard
    loss_fn: Callable[..., TTTOutput] = draft_ttt_loss  # its unroll torch.compile'd with --compile
    logit_spec: LogitSpec | None = None  # the target's logit processing (Gemma-2 softcapping)
    heldout: list[int] = field(default_factory=list)  # sample indices never trained on (the learning curve)
    unused: list[int] = field(default_factory=list)  # not trained on: held out, and beyond --train-samples
    heldout_batches: list[dict] | None = None  # --online: the held-out features, made once (heldout.py)

    @property
    def step(self) -> int:
        return self.loop.step

    @property
    def clock(self) -> Clock:
        return Clock(self.loop.train_seconds, self.loop.train_cpu_seconds)

    def out_of_time(self) -> bool:
        return self.cfg.time_budget_s is not None and spent(self.loop, self.cfg.time_clock) >= self.cfg.time_budget_s


def spent(loop: LoopState, clock: str) -> float:
    """Training seconds on the budget's clock (`--time-clock`)."""
    return loop.train_cpu_seconds if clock == "cpu" else loop.train_seconds


def _time_cosine(budget: float, warmup_ratio: float, floor: float, loop: LoopState, clock: str):
    """`_cosine` over the fraction of a time budget spent rather than over steps."""

    def f(_step: int) -> float:
        p = min(1.0, spent(loop, clock) / budget)
        if p < warmup_ratio:
            return max(p / warmup_ratio, 0.01)
        q = (p - warmup_ratio) / max(1e-9, 1 - warmup_ratio)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * q))

    return f


def _cosine(total: int, warmup: int, floor: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))

    return f


def load_source(cfg: TrainConfig, run_dir: Path, device: torch.device):
    """(source, identity dict, target config, {embed, lm_head, norm}, aux ids), all inputs checked."""
    if cfg.online:
        data_dir = cfg.data or run_dir / "data"
        gm = (
            read_manifest(data_dir, "gen-data", "eagle3 gen-data --target TARGET --input FILE --run runs/NAME")
            if (data_dir / "manifest.json").exists()
            else {}
        )
        tpath = cfg.target or (gm.get("target") or {}).get("path")
        if not tpath:
            raise UsageError("--online needs the target model", "--target PATH", "eagle3 train --online --target ...")
        tp = cfg.tensor_parallel_size
        target = open_target(tpath, load=True, device=str(device), dtype=cfg.target_dtype, tensor_parallel=tp)
        target_model, tok, tpath = target.model, target.tokenizer, target.path
        tcfg = text_config(target_model.config.to_dict())
        aux_ids = choose_aux_ids(cfg.aux_layers, tcfg["num_hidden_layers"], None)
        source: CacheSource | OnlineSource = OnlineSource(
            [data_dir, *map(Path, cfg.extra_data)],
            target_model,
            tok,
            aux_ids,
            cfg.draft_vocab_size or ONLINE_DRAFT_VOCAB,
            cfg.max_length,
            sharded=tp > 1,
        )
        if tp > 1:  # each rank holds 1/N of the split matrices: the three the draft needs come from the files
            weights = load_target_weights(tpath)[1]
        else:
            weights = {
                "embed": target_model.get_input_embeddings().weight.float().cpu(),
                "lm_head": target_model.get_output_embeddings().weight.float().cpu(),
                "norm": target_model.model.norm.weight.float().cpu(),
            }
    else:
        cache_dir = cfg.cache or run_dir / "cache"
        if not Path(cache_dir).exists():
            raise UsageError(
                f"no cache at {cache_dir}",
                "the output folder of `eagle3 cache`",
                f"eagle3 cache --run {run_dir}   (or train without one: eagle3 train --run {run_dir} --online)",
            )
        source = CacheSource(cache_dir)
        if cfg.draft_vocab_size is not None:
            source.narrow_vocab(cfg.draft_vocab_size)
        tpath = cfg.target or source.target.get("path")
        if not tpath or not Path(tpath).exists():
            raise UsageError(
                f"the cache's target model {tpath!r} is not on this machine",
                "the target model folder the cache was built with",
                "pass --target PATH",
            )
        target = open_target(tpath)
        tpath, tok = target.path, target.tokenizer
        tcfg, weights = load_target_weights(tpath)
        aux_ids = choose_aux_ids(cfg.aux_layers, tcfg["num_hidden_layers"], source.aux_layer_ids)
    identity = target.identity.as_dict()
    if source.target:
        check_matches(
            "the cache",
            {k: source.target.get(k) for k in identity if k != "path"},
            {k: v for k, v in identity.items() if k != "path"},
            f"rebuild the cache with this target: eagle3 cache --run {run_dir}, or pass --target "
            f"{source.target.get('path')}",
        )
    vocab = int(tcfg["vocab_size"])
    bad = map_problems(source.d2t, source.t2d, vocab)  # the one rule for maps, as heads are read
    if bad:
        raise UsageError(
            f"the draft vocab map does not fit the target (vocab {vocab}): " + "; ".join(bad),
            f"a draft vocab of at most {vocab} target tokens, one draft id per target id",
            f"{CACHE_NEXT} --draft-vocab-size N",
        )
    return source, identity, tcfg, weights, aux_ids


def setup(cfg: TrainConfig) -> Trainer:
    run_dir = cfg.run_dir
    train_dir, head_dir = run_dir / "train", run_dir / "head"
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    use_ds = cfg.deepspeed is not None
    device = pick_device(cfg.device)
    if use_ds and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    source, identity, tcfg, weights, aux_ids = load_source(cfg, run_dir, device)
    start = start_head(cfg, source, identity, tcfg, aux_ids) if cfg.init_head is not None else None
    draft_vocab = len(source.d2t)

    # ---- the draft
    torch.manual_seed(cfg.seed)
    draft = Eagle3Draft(
        draft_config_from_target(tcfg, draft_vocab, aux_ids, cfg.norm_before_fc, cfg.norm_before_residual)
    )
    init_draft_from_weights(
        draft,
        weights["embed"],
        weights["lm_head"],
        weights["norm"],
        source.d2t,
        source.t2d,
        norm_offset=final_norm_offset(tcfg),
    )
    apply_init(draft, cfg.init, cfg.lm_head)
    if start is not None:  # the head's weights over the fresh ones (requires_grad as apply_init set it)
        draft.load_state_dict({**start.state_dict(), "embed_tokens.weight": draft.embed_tokens.weight})
    draft.to(device)
    lm_head = weights["lm_head"].to(device) if source.teacher == "last_hidden" else None
    per_step = world * cfg.grad_accum
    sizes = getattr(source, "folder_sizes", [len(source.lengths)])  # --data first, then --extra-data
    heldout = heldout_indices(sizes[0], cfg.heldout_samples)
    trainable = sizes[0] - len(heldout)
    if (cfg.train_samples or 0) + cfg.skip_samples > trainable or cfg.skip_samples >= trainable:
        raise UsageError(
            f"--skip-samples {cfg.skip_samples} + --train-samples {cfg.train_samples}: the data has {trainable} "
            f"trainable samples ({len(heldout)} of {sizes[0]} are held out)",
            f"skip + train at most {trainable}",
            "a smaller --train-samples or --skip-samples (leave --train-samples out to train on all the rest)",
        )
    unused = unused_indices_in_folders(sizes, heldout, cfg.train_samples, cfg.skip_samples, cfg.extra_data_from)
    if len(sizes) > 1:  # what each folder gives this run, before it starts
        shares = folder_shares(cfg, run_dir, source, set(unused))
        console.log(
            "training samples: " + "; ".join(f"{r['samples']:,} of {r['of']:,} from {r['folder']}" for r in shares)
        )
    n_batches = len(plan_for(cfg, source.lengths, 0, exclude=unused))
    if n_batches < per_step:
        raise UsageError(
            f"{n_batches} batches per epoch, fewer than {per_step} (ranks x --grad-accum)",
            "more data, a smaller --token-budget or --grad-accum",
        )
    loop = LoopState()
    if cfg.time_budget_s is not None:  # the budget ends the run; --max-steps (if given) caps it
        total = cfg.max_steps or 10**9
        schedule = _time_cosine(cfg.time_budget_s, cfg.warmup_ratio, cfg.min_lr_ratio, loop, cfg.time_clock)
    else:
        total = cfg.max_steps or cfg.epochs * (n_batches // per_step)
        schedule = _cosine(total, int(cfg.warmup_ratio * total), cfg.min_lr_ratio)
    optimizer, sched = build_optimizer(draft, cfg.optimizer, cfg.lr, cfg.weight_decay, schedule)
    autocast = torch.bfloat16 if pick_dtype(device, cfg.dtype) == torch.bfloat16 else None
    model = draft
    if use_ds:
        from .launch import deepspeed_engine

        model, optimizer, sched = deepspeed_engine(draft, optimizer, sched, cfg, train_dir, autocast is not None)
        autocast = None  # the engine's bf16 section casts the model itself
    tr = Trainer(
        cfg,
        run_dir,
        train_dir,
        head_dir,
        source,
        draft,
        model,
        optimizer,
        sched,
        lm_head,
        device,
        autocast,
        identity,
        total,
        rank,
        world,
        use_ds,
        loop,
    )
    tr.logit_spec = logit_spec(tcfg)
    tr.heldout = heldout
    tr.unused = unused
    if cfg.compile:
        tr.loss_fn = compiled_loss(device)
    resume(tr)
    if cfg.tensorboard and rank == 0:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise UsageError(
                "--tensorboard needs the tensorboard package",
                "pip install tensorboard",
                "or drop --tensorboard (metrics.jsonl has the same numbers)",
            ) from e
        tr.tb = SummaryWriter(str(train_dir / "tb"), purge_step=tr.loop.step + 1 if tr.loop.step else None)
    return tr


def folder_shares(cfg: TrainConfig, run_dir: Path, source, unused: set[int]) -> list[dict]:
    """Samples and sample tokens each gen-data folder gives the run, --data's first (with --extra-data)."""
    rows, start = [], 0
    for folder, n in zip([cfg.data or run_dir / "data", *cfg.extra_data], source.folder_sizes):
        used = [i for i in range(start, start + n) if i not in unused]
        rows.append(
            {"folder": str(folder), "samples": len(used), "of": n, "tokens": sum(source.lengths[i] for i in used)}
        )
        start += n
    return rows


def start_head(cfg: TrainConfig, source, identity: dict, tcfg: dict, aux_ids: tuple[int, ...]) -> Eagle3Draft:
    """--init-head: the head to start from, checked against this run's target (`head.check`) and settings
    (aux layers, norms, draft vocab); its d2t becomes the source's, so the loss and the exported head
    use the head's draft vocab."""
    from ..head.check import target_facts
    from ..head.read import load_any_head

    # the head against this run's target by the one head check, as eval and serve ask it
    facts = target_facts(tcfg, Path(identity["path"]), identity)
    draft, spec = load_any_head(Path(cfg.init_head), None, torch.float32, target=facts)  # type: ignore[arg-type]
    where = f"--init-head {cfg.init_head}"
    for notice in spec.notices:
        console.warn(notice)
    problems = []
    if tuple(spec.aux_layer_ids) != tuple(aux_ids):
        problems.append(
            f"it reads aux layers {list(spec.aux_layer_ids)}, this run {list(aux_ids)} "
            f"(--aux-layers {','.join(map(str, spec.aux_layer_ids))})"
        )
    for name in ("norm_before_fc", "norm_before_residual"):
        if getattr(spec, name) != getattr(cfg, name):
            flag = name.replace("_", "-")
            problems.append(
                f"its {name} is {getattr(spec, name)}, this run's {getattr(cfg, name)} (--{'' if getattr(spec, name) else 'no-'}{flag})"
            )
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size != spec.draft_vocab_size:
        problems.append(
            f"its draft vocab is {spec.draft_vocab_size}, this run asks for {cfg.draft_vocab_size} (--draft-vocab-size {spec.draft_vocab_size})"
        )
    if problems:
        raise UsageError(
            f"{where} cannot start this run: " + "; ".join(problems),
            "a head whose target, aux layers, norms and draft vocab are this run's",
            "give this run the head's settings (the flags in parentheses), or leave --init-head out",
        )
    if len(source.d2t) != len(draft.d2t) or not torch.equal(source.d2t.to(torch.long).cpu(), draft.d2t.cpu()):
        console.warn(
            f"{where} maps its {spec.draft_vocab_size} draft ids to other target ids than this run's data "
            "(its own draft vocab): training goes on with the head's map, so the loss covers the head's tokens"
        )
    source.d2t, source.t2d = draft.d2t.clone(), draft.t2d.clone()
    console.log(f"starting from {cfg.init_head} ({spec.layout} layout, draft vocab {spec.draft_vocab_size})")
    return draft


# Path-valued settings: compared resolved, so `runs/x` and `/abs/.../runs/x` are the same run.
PATH_KEYS = ("cache", "data", "target", "hostfile", "init_head")
LIST_PATH_KEYS = ("extra_data",)


def _resolved(v: str | None) -> str | None:
    return None if v in (None, "None") else str(Path(v).expanduser().resolve())


def config_key(cfg: TrainConfig | dict) -> dict:
    """Config fields that must match for a resume to be the same run. The run folder itself is not
    one of them: the checkpoint lives inside it, whatever path names it."""
    d = config_dict(cfg) if isinstance(cfg, TrainConfig) else dict(cfg)
    for k in PATH_KEYS:
        if k in d:
            d[k] = _resolved(d[k])
    d = upgrade_recorded(d)
    for k in LIST_PATH_KEYS:  # a tuple on the line, a list in a recorded JSON config
        d[k] = [_resolved(v) for v in d.get(k) or ()]
    if d.get("online"):  # the vocab an online run trains, whichever way it was spelled
        d["draft_vocab_size"] = d.get("draft_vocab_size") or ONLINE_DRAFT_VOCAB
    for k in (
        "run",
        "resume",
        "max_steps",
        "epochs",
        "log_every",
        "save_every",
        "keep_checkpoints",
        "tensorboard",
        "hostfile",
        "master_addr",
        "master_port",
        "device",
        "heldout_every",  # measuring reads the head and changes nothing (heldout_samples does: it is data)
        "heldout_depth",
        "head_from",  # which weights the head gets at the end: training is the same
        "tensor_parallel_size",  # where the target's forward runs: float rounding only, as --compile
        "compile",  # changes float rounding only: a resume may switch it (bit-exactness is then not promised)
        "prefetch",  # when batches are read, not what they hold
    ):
        d.pop(k, None)
    return d


def compile_preflight(device: torch.device) -> None:
    """UsageError (exit 2) when torch.compile cannot build kernels for `device` on this machine."""
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise UsageError(
            "--compile on CPU needs a C++ compiler (torch.compile builds C++ kernels), and none is on PATH",
            "g++ or clang++ installed",
            "apt install g++   (or train without --compile)",
        )
    if device.type != "cuda":
        return
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        raise UsageError(
            f"--compile on CUDA needs Triton, which is not installed beside torch {torch.__version__}",
            "the triton package matching this torch (CUDA wheels of torch install it)",
            "pip install triton   (or train without --compile)",
        )
    cc = os.environ.get("CC")
    if not (cc and shutil.which(cc)) and not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        raise UsageError(
            "--compile on CUDA needs a C compiler: Triton builds its kernel launcher with one at the first "
            f"step, and none is on PATH{f' (CC={cc} is not found)' if cc else ''}",
            "gcc or clang installed (or CC naming one)",
            "apt install gcc   (or train without --compile)",
        )


def compiled_loss(device: torch.device):
    """`draft_ttt_loss` with its unroll under torch.compile (`compiled_ttt_loss`). Inductor on CPU
    builds C++ kernels; on CUDA it writes Triton kernels, and Triton compiles a small C launcher with
    the host's C compiler at the first call: both are checked before the run starts."""
    compile_preflight(device)
    loss = compiled_ttt_loss()

    def announced(*args, **kw):
        # the first call compiles, and nothing advances meanwhile: say so before it starts
        if announced.compiles_next:
            announced.compiles_next = False
            console.log("compiling the TTT step (first batch shape, can take minutes; later shapes reuse it)")
        return loss(*args, **kw)

    announced.compiles_next = True  # type: ignore[attr-defined]  # fit() leaves that step off the clock
    return announced


def resume(tr: Trainer) -> None:
    metrics = tr.train_dir / "metrics.jsonl"
    path = ckpt.latest(tr.train_dir)
    gone = ckpt.dangling_last(tr.train_dir)
    if gone is not None and tr.cfg.resume and tr.rank == 0:  # say so rather than restart from step 0 silently
        console.warn(
            f"{tr.train_dir / ckpt.CKPT_DIR / 'last'} points at {gone}, which is gone: training starts from step 0 "
            f"(point it at an older step: ln -sfn step-NNNNNNN.safetensors last, then rerun to resume from there)"
        )
    if not tr.cfg.resume or path is None:
        if tr.rank == 0:
            if path is not None:
                console.warn(f"--no-resume: ignoring checkpoints in {path.parent} (they will be replaced)")
            metrics.unlink(missing_ok=True)
        return
    state = ckpt.load(path)
    check_schema(state, ckpt.CheckpointState, path, "a checkpoint written by `eagle3 train`", ckpt.damaged_next(path))
    # a checkpoint written before a setting existed ran with that setting's default
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    new = config_key(tr.cfg)
    old = {**{k: defaults[k] for k in new if k in defaults}, **config_key(state["config"])}
    if old != new:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise UsageError(
            f"{path} was written with other settings ({', '.join(diff)}):\n"
            + "\n".join(f"  {k}: checkpoint has {old.get(k)!r}, this command {new.get(k)!r}" for k in diff),
            "the same settings as the run being resumed",
            "rerun with the checkpoint's values above to continue it (progress is kept), or train into another "
            f"run folder; --no-resume discards the checkpoints in {path.parent}",
        )
    trained_on, now = state.get("input_fingerprint"), tr.source.fingerprint
    if trained_on is not None and trained_on != now:  # (checkpoints of older versions do not record it)
        kind = "data" if tr.cfg.online else "cache"
        where = (tr.cfg.data or tr.run_dir / "data") if tr.cfg.online else (tr.cfg.cache or tr.run_dir / "cache")
        raise UsageError(
            f"{path} was trained on another {kind}: the checkpoint records {kind} fingerprint {trained_on}, "
            f"{where} now has {now} (its files were replaced or rebuilt)",
            f"the {kind} this run was trained on",
            f"put that {kind} back to continue, train on this one in another run folder (--run runs/OTHER "
            f"--{kind} {where}), or start over here: eagle3 train --run {tr.run_dir} --no-resume",
        )
    if tr.deepspeed:
        ckpt.load_deepspeed(tr.model, tr.train_dir / "deepspeed", state["ds_tag"])
    else:
        ckpt.restore(path, state, tr.draft, tr.optimizer, tr.scheduler)
    gpus_changed = ckpt.set_rng_state(state.get("rng"), path)
    if gpus_changed and tr.rank == 0:
        console.log(f"resume: {gpus_changed}")
    tr.loop.restore(state)
    if tr.rank == 0:
        ckpt.truncate_metrics(metrics, tr.loop.step)
    s = tr.loop
    console.log(f"resumed from {path.name}: step {s.step}, epoch {s.epoch}, batch {s.batch_pos}")
