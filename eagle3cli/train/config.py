"""`TrainConfig`: every knob of `eagle3 train` (recipe section `train:`; flags override).

Each field is one flag (eagle3cli/options.py): its docstring is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from ..config import Panels, flag
from ..speculate.aux_layers import aux_layer_problems, parse_aux_layers

DEEPSPEED_PRESETS = ("zero1", "zero2", "zero3")
TrainDtype = Literal["auto", "fp32", "bf16"]
Optimizer = Literal["adamw", "muon"]
Loss = Literal["ce", "tv", "lk"]
LmHead = Literal["target", "frozen", "fresh"]
Init = Literal["random", "soft", "pass-top"]
TimeClock = Literal["wall", "cpu"]


ONLINE_DRAFT_VOCAB = 32000  # --online's draft vocab when --draft-vocab-size is not given


def upgrade_recorded(config: dict) -> dict:
    """A config recorded by an older eagle3 (a checkpoint's, a train manifest's) as this version
    reads it. Before --draft-vocab-size applied offline, offline runs recorded the online default
    (32000) and ignored it, training the cache's vocab, which is what None says now."""
    d = dict(config)
    d.setdefault("target_dtype", "auto")  # before --target-dtype every online run ran its target in auto
    d.setdefault("extra_data", [])  # before --extra-data a run read one folder
    d.setdefault("extra_data_from", 0)
    if d.get("time_budget_s") is not None:
        d.setdefault("time_clock", "cpu")  # before --time-clock a budget counted CPU seconds
    if not d.get("online") and d.get("draft_vocab_size") == ONLINE_DRAFT_VOCAB:
        d["draft_vocab_size"] = None
    return d


@dataclass(frozen=True)
class TrainConfig:
    PANELS: ClassVar[Panels] = {
        "Run and data": (
            "run", "cache", "online", "data", "extra_data", "extra_data_from", "target", "target_dtype",
            "tensor_parallel_size", "max_length", "train_samples", "skip_samples",
        ),
        "Model": ("init", "init_head", "lm_head", "aux_layers", "draft_vocab_size", "norm_before_fc",
                  "norm_before_residual"),
        "TTT": ("ttt_steps", "step_weight"),
        "Optimisation": (
            "optimizer", "loss", "lr", "min_lr_ratio", "warmup_ratio", "weight_decay", "grad_clip", "grad_accum",
            "token_budget", "max_attention", "max_batch_size", "feature_noise", "seed",
        ),
        "Budget and checkpoints": (
            "epochs", "max_steps", "time_budget_s", "time_clock", "save_every", "keep_checkpoints", "resume", "head_from",
        ),
        "Devices and DeepSpeed": (
            "device", "dtype", "compile", "prefetch", "deepspeed", "nproc", "hostfile", "master_addr", "master_port",
        ),
        "Output: logs and the held-out curve": (
            "log_every", "tensorboard", "heldout_samples", "heldout_every", "heldout_depth",
        ),
    }  # fmt: skip
    run: Path | None = flag(None, required=True)
    """Run folder: reads runs/NAME/cache (or data/ with --online), writes train/ and head/."""
    cache: Path | None = None
    """Cache folder (default RUN/cache)."""
    online: bool = flag(False, "--online/--offline")
    """Train from RUN/data conversations, running the target in-process (no cache)."""
    data: Path | None = None
    """gen-data folder for --online (default RUN/data)."""
    extra_data: tuple[str, ...] = ()
    """--online: more gen-data folders (repeat the flag), trained beside --data: a corpus of several
    sources kept in their own folders (e.g. ShareGPT and GSM8K). Each keeps its own fixed order; a
    --skip-samples/--train-samples window over --data takes the same share of every extra folder, so
    sessions that walk --data walk them all in step. The held-out set stays --data's: a learning
    curve stays comparable when a source is added (score the others with `eagle3 eval --bench`)."""
    extra_data_from: int = 0
    """The --skip-samples at which --extra-data joined a run already under way (the sessions before it
    saw --data alone): the extra folders' windows are shares of --data's samples after this point,
    so the sessions from then on cover every extra folder exactly once."""
    target: Path | None = None
    """Target model folder (default: the path recorded in the cache manifest)."""
    target_dtype: TrainDtype = "auto"
    """--online: the dtype the target computes its features in, as `eagle3 cache --dtype` (auto = fp32 on
    CPU, bf16 on GPU). Offline the cache's features are already computed: leave it at auto."""
    tensor_parallel_size: int = 1
    """--online: split the target over this many ranks by transformers' tensor-parallel plan, for a
    target bigger than one process (or GPU): as many as --nproc, under --deepspeed; its heads must
    divide by it. Each forward runs the ranks' micro-batches as one batch."""
    ttt_steps: int = flag(7, "--depth", "--ttt-steps")
    """Draft depth K the head is trained for: the training-time-test unroll (1 = no TTT, the paper's
    ablation; --ttt-steps is the older name)."""
    step_weight: float = 0.8
    """Loss weight of TTT step k is step_weight**k."""
    optimizer: Optimizer = "adamw"
    """adamw, or muon (torch.optim.Muon on the 2-D weights of fc and the decoder layer, with its
    learning rate matched to AdamW's RMS so one --lr serves both; AdamW on norms and lm_head)."""
    loss: Loss = "ce"
    """Per-step loss against the target's distribution over the draft vocab: ce (soft cross-entropy),
    tv (total variation 0.5*|p - q|_1: 1 - TV is the acceptance probability of a sampled token), or lk (LK loss:
    -log(1 - TV), acceptance optimised directly, with TV's gradient scaled by 1/acceptance)."""
    lm_head: LmHead = "target"
    """The head's lm_head: target (the target's rows of the draft vocab, trained), frozen (those
    rows, not trained), or fresh (random)."""
    init: Init = "random"
    """fc and the decoder layer: random; soft (random, with the output norm scaled so a random hidden
    state's logits spread 0.3: the first loss starts near ln(draft vocab), not far above it); or
    pass-top (soft, and fc passes the top aux feature through while the layer's output projections
    start at zero: step 0 starts as the target's own read-out of that layer)."""
    norm_before_fc: bool = False
    """EAGLE-3.1: one RMSNorm (`input_norm`) over the concatenated aux features before fc, so layers
    of very different scale enter fc alike. vLLM and llama.cpp load it; SGLang does not (export and
    serve refuse such a head for it)."""
    norm_before_residual: bool = False
    """EAGLE-3.1: the decoder layer's residual is hidden_norm(h) rather than the raw h. vLLM and
    llama.cpp load it; SGLang does not (export and serve refuse such a head for it)."""
    feature_noise: float = 0.0
    """Gaussian noise on the aux features, as a fraction of each token's feature RMS (0.05 in
    speculators' small-data defaults): the draft learns to tolerate its own imperfect states."""
    aux_layers: str = "cache"
    """Which aux layers: cache (whatever the cache holds), default [2, L//2, L-3], top [L-1], or ids 2,4,5
    (must match the cache)."""
    draft_vocab_size: int | None = None
    """Draft vocab size. Offline: the cache's by default; a smaller N trains on the cache's N most
    frequent assistant tokens (what `eagle3 cache --draft-vocab-size N` would choose): the head's
    lm_head, most of a draft step's cost, shrinks with it. --online: 32000 by default."""
    max_length: int = 2048
    """Tokens per sample; longer samples are cut."""
    train_samples: int | None = None
    """Train on N of the cache's samples (default: all but the held-out ones): the first N of one fixed
    seeded order, so subsets are nested (N < M: every sample of N is in M) and the held-out set is the
    same for every N. For a data-scaling curve (benchmarks/data_scaling.py)."""
    skip_samples: int = 0
    """Skip the first N samples of --train-samples' fixed order and train on the ones after them (the
    next --train-samples, or all the rest): a continuation that sees new data, e.g. the next session of a
    run over a corpus too large for one, warm-started with --init-head from the head the first N made."""
    init_head: Path | None = None
    """Start from this head's weights (a head folder of any layout eagle3 reads: ours, SpecForge/SGLang,
    vLLM, speculators) rather than the target's rows: its draft vocab, aux layers and norms become the
    run's. Continues a head in a new session, or fine-tunes a published one on new data. The optimizer
    starts fresh (a head holds no Adam moments), under this run's warmup and schedule."""
    epochs: int = 1
    """Passes over the data."""
    time_budget_s: float | None = None
    """Train for this many wall-clock seconds (held-out passes and checkpoints excluded, summed over
    resumed sessions) instead of a number of steps; the warmup and cosine schedule run over the
    budget. --time-clock cpu counts this process's CPU seconds instead."""
    prefetch: int = 2
    """Micro-batches read ahead in a background thread (cache reads and fp8 decoding, --online's target
    forwards overlap the step; pinned host memory for an asynchronous copy on CUDA); 0 reads each one
    in the loop. Changes no result."""
    time_clock: TimeClock = "wall"
    """The clock --time-budget-s counts: wall (seconds of training, what a GPU run costs) or cpu (this
    process's core-seconds: 3600 with OMP_NUM_THREADS=1 is one core-hour; compares recipes per
    core-hour on a CPU shared with other jobs, which does not shorten a run)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (overrides epochs)."""
    lr: float = 3e-4
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.0
    """Cosine schedule floor as a fraction of --lr."""
    warmup_ratio: float = 0.03
    """Share of the optimizer steps spent in linear warmup."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 0.5
    """Max global gradient norm (0 = off)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    token_budget: int = 4096
    """Padded tokens per micro-batch (batch size x longest sample)."""
    max_attention: int = 4_194_304
    """Bound of batch size x longest length^2 per micro-batch (attention memory of the TTT steps
    grows with T^2): the default, 2048^2, takes one 2048-token sample or four of 1024."""
    max_batch_size: int = 64
    """Samples per micro-batch at most."""
    seed: int = 0
    """Seed of the data order and the head's initialisation."""
    log_every: int = 10
    """Optimizer steps per metrics line (metrics.jsonl + one log line)."""
    save_every: int = 100
    """Optimizer steps per checkpoint (must be a multiple of --log-every for exact resume)."""
    keep_checkpoints: int = 2
    """Checkpoints kept besides the best one."""
    heldout_samples: int = 32
    """Cached conversations held out of training for the learning curve (at most a tenth of the
    cache; 0 trains on everything and draws no curve)."""
    heldout_every: int = 50
    """Optimizer steps between held-out acceptance measurements (and one at the end): chain tau and
    alpha_k at --heldout-depth, in metrics.jsonl and RUN/train/learning_curve.png."""
    heldout_depth: int = 8
    """Draft depth of the held-out chain estimate (as `eagle3 eval --depth`; may exceed --depth)."""
    head_from: Literal["best", "last"] = "best"
    """Which weights RUN/head gets: best = the checkpoint with the highest held-out tau (measured
    every --heldout-every steps and at the end; tau can fall while the loss still falls), last = the
    final step's. With no held-out split (--heldout-samples 0) the last is exported."""
    resume: bool = True
    """Resume from RUN/train/checkpoints/last when it exists (--no-resume starts over)."""
    device: str | None = None
    """cpu, cuda, cuda:N (default: cuda if available)."""
    dtype: TrainDtype = "auto"
    """Head weights and autocast; auto = bf16 on GPU, fp32 on CPU."""
    deepspeed: str | None = None
    """zero1 | zero2 | zero3 | a DeepSpeed config JSON: launch through the deepspeed launcher."""
    nproc: int | None = None
    """Processes per node for --deepspeed (default 1; with --hostfile each host's slots=N)."""
    hostfile: Path | None = None
    """DeepSpeed hostfile (`HOST slots=N` per line) for multi-node runs; needs pdsh, ssh, shared storage."""
    master_addr: str | None = None
    """Multi-node: address of the first hostfile node as the others reach it (default: its `hostname -I`)."""
    master_port: int | None = None
    """Rendezvous port on the master node (default: a port found free on that node over ssh)."""
    tensorboard: bool = False
    """Also write TensorBoard scalars to RUN/train/tb (needs the tensorboard package)."""
    compile: bool = False
    """torch.compile the TTT step (fuses its elementwise work: ~5x at SmolLM2's shape on CPU); the first
    steps pay a one-off compilation (a minute or two; on CPU it needs a C++ compiler)."""

    @property
    def run_dir(self) -> Path:
        assert self.run is not None, "validate() requires --run"
        return Path(self.run)

    def validate(self) -> list[str]:
        e = []
        if self.run is None:
            e.append("--run is required (the run folder, e.g. runs/demo)")
        if self.train_samples is not None and (not isinstance(self.train_samples, int) or self.train_samples < 1):
            e.append(f"--train-samples {self.train_samples!r}: expected an integer >= 1 (or leave it out: all)")
        if not isinstance(self.skip_samples, int) or self.skip_samples < 0:
            e.append(f"--skip-samples {self.skip_samples!r}: expected an integer >= 0")
        if self.extra_data and not self.online:
            e.append("--extra-data: only --online reads gen-data folders (a cache is one folder); add --online")
        if not isinstance(self.extra_data_from, int) or not 0 <= self.extra_data_from <= self.skip_samples:
            e.append(
                f"--extra-data-from {self.extra_data_from!r}: expected 0..--skip-samples ({self.skip_samples}): "
                "the point of --data's order where the extra folders joined, at or before this session's start"
            )
        if not 0.0 <= self.feature_noise <= 1.0:
            e.append(f"--feature-noise {self.feature_noise}: expected a fraction in 0..1")
        if self.optimizer == "muon" and self.deepspeed is not None:
            e.append("--optimizer muon is not supported under --deepspeed (the engine builds its own optimizer)")
        if self.max_attention < 1:
            e.append(f"--max-attention {self.max_attention}: expected batch x length^2 >= 1, e.g. 4194304 (2048^2)")
        if self.prefetch < 0:
            e.append(f"--prefetch {self.prefetch}: expected 0 (off) or more micro-batches")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            e.append(f"--time-budget-s {self.time_budget_s}: expected seconds > 0")
        if self.heldout_samples < 0 or self.heldout_every < 1 or not 1 <= self.heldout_depth <= 32:
            e.append("--heldout-samples >= 0, --heldout-every >= 1 and --heldout-depth in 1..32")
        if not 1 <= self.ttt_steps <= 32:
            e.append(f"--depth {self.ttt_steps}: expected 1..32")
        for name in (
            "lr",
            "token_budget",
            "max_batch_size",
            "grad_accum",
            "log_every",
            "save_every",
            "epochs",
            "max_length",
        ):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v <= 0:
                e.append(f"--{name.replace('_', '-')} {v!r}: expected a positive number")
        if self.draft_vocab_size is not None and (
            not isinstance(self.draft_vocab_size, int) or self.draft_vocab_size <= 0
        ):
            e.append(f"--draft-vocab-size {self.draft_vocab_size!r}: expected a positive integer, e.g. 16384")
        if self.target_dtype != "auto" and not self.online:
            e.append(
                f"--target-dtype {self.target_dtype}: only --online runs the target (a cache's features were "
                "computed in the cache's --dtype); drop it, or add --online"
            )
        if self.tensor_parallel_size != 1:
            ranks = (self.nproc or 1) if self.hostfile is None else None
            if not self.online:
                e.append(
                    "--tensor-parallel-size: only --online runs the target (a cache holds its features); add --online"
                )
            elif self.deepspeed is None or ranks != self.tensor_parallel_size:
                e.append(
                    f"--tensor-parallel-size {self.tensor_parallel_size}: the target is split over the ranks of one "
                    f"node, so give as many: --deepspeed zero2 --nproc {self.tensor_parallel_size} (no --hostfile)"
                )
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps <= 0):
            e.append(f"--max-steps {self.max_steps!r}: expected a positive integer")
        if not 0 <= self.min_lr_ratio <= 1:
            e.append(
                f"--min-lr-ratio {self.min_lr_ratio}: expected 0 <= r <= 1 (the cosine floor as a fraction of --lr)"
            )
        for name in ("weight_decay", "grad_clip", "keep_checkpoints"):
            if getattr(self, name) < 0:
                e.append(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 0")
        if not 0 <= self.warmup_ratio < 1:
            e.append(f"--warmup-ratio {self.warmup_ratio}: expected 0 <= r < 1")
        if not 0 < self.step_weight <= 1:
            e.append(f"--step-weight {self.step_weight}: expected 0 < w <= 1")
        if not e and self.save_every % self.log_every:
            e.append(f"--save-every {self.save_every} is not a multiple of --log-every {self.log_every}")
        try:
            choice = parse_aux_layers(self.aux_layers)
        except ValueError:
            e.append(f"--aux-layers {self.aux_layers!r}: expected cache, default, top or ids like 2,4,5")
        else:
            if isinstance(choice, tuple):
                e += [f"--aux-layers: {p}" for p in aux_layer_problems(choice)]
        if self.nproc is not None and (not isinstance(self.nproc, int) or self.nproc < 1):
            e.append(f"--nproc {self.nproc!r}: expected a positive integer")
        if self.master_port is not None and not (isinstance(self.master_port, int) and 0 < self.master_port < 65536):
            e.append(f"--master-port {self.master_port!r}: expected a port number 1..65535")
        if self.compile and self.deepspeed is not None:
            e.append("--compile is not supported under --deepspeed (the engine wraps the module): drop one of them")
        if self.deepspeed is None:
            ds_only = [f for f in ("hostfile", "master_addr", "master_port") if getattr(self, f) is not None]
            if self.nproc not in (None, 1):
                ds_only.insert(0, "nproc")
            if ds_only:
                names = ", ".join("--" + f.replace("_", "-") for f in ds_only)
                e.append(f"{names} need --deepspeed (zero1|zero2|zero3|CONFIG.json)")
        return e
