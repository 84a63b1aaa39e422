"""DeepSpeed: config presets and checks, re-launch through the `deepspeed` launcher, the engine.

`eagle3 train --deepspeed zero2 --nproc 2` resolves a DeepSpeed config from the flags, checks it,
writes it and the resolved train config to RUN/train/, then runs
`deepspeed --num_gpus N [--hostfile F] --module eagle3cli train --recipe RUN/train/launch.yaml`.
Each rank then builds a DeepSpeed engine around the same draft, AdamW and cosine schedule
(a client optimizer: the learning rate schedule and clipping stay the flags'). On CPU DeepSpeed
picks its CPU accelerator (gloo/ccl); its first run JIT-builds a comm op (~80 s here).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import yaml

from .. import console
from ..config import config_dict
from ..errors import UsageError
from ..manifest import atomic_write_json, atomic_write_text, read_json
from .config import DEEPSPEED_PRESETS, TrainConfig

# Sections whose values eagle3 sets from its own flags; "auto" in a user config means "take the flag".
_OURS = {"gradient_accumulation_steps", "gradient_clipping", "train_micro_batch_size_per_gpu", "train_batch_size"}
_REFUSED = {
    "optimizer": "--lr/--weight-decay (eagle3 uses AdamW)",
    "scheduler": "--warmup-ratio/--min-lr-ratio (eagle3 uses warmup + cosine)",
    "fp16": "bf16 (fp16 loss scaling is not supported)",
}


def deepspeed_config(cfg: TrainConfig, bf16: bool) -> dict:
    """The resolved DeepSpeed config for a preset name or a JSON file, checked before any launch."""
    spec = cfg.deepspeed
    if spec in DEEPSPEED_PRESETS:
        user: dict = {"zero_optimization": {"stage": int(spec[-1])}}
        if spec == "zero3":
            user["zero_optimization"].update(stage3_gather_16bit_weights_on_model_save=True)
    else:
        path = Path(str(spec))
        if not path.is_file():
            raise UsageError(
                f"--deepspeed {spec!r} is neither a preset nor a file",
                f"one of {', '.join(DEEPSPEED_PRESETS)} or a DeepSpeed config JSON",
                "eagle3 train --run runs/NAME --deepspeed zero2 --nproc 2",
            )
        try:
            user = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UsageError(f"DeepSpeed config {path} is not valid JSON: {e}", "a JSON object") from e
        if not isinstance(user, dict):
            raise UsageError(f"DeepSpeed config {path} must be a JSON object, got {type(user).__name__}")
    problems = [
        f"'{k}' is set by {why}"
        for k, why in _REFUSED.items()
        if k in user and (k != "fp16" or (user[k] or {}).get("enabled"))
    ]
    for k in _OURS & set(user):
        if user[k] != "auto":
            problems.append(
                f"'{k}' is set from eagle3's flags (--grad-accum/--grad-clip/--token-budget): use \"auto\" or drop it"
            )
    if not isinstance(user.get("bf16", {}), dict) or user.get("bf16", {}).get("enabled", "auto") not in (
        True,
        False,
        "auto",
    ):
        problems.append("'bf16' must be an object with enabled: true | false | \"auto\"")
    zero = user.get("zero_optimization", {})
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        DeepSpeedZeroConfig(**zero)
    except ImportError:
        problems.append("deepspeed is not installed (pip install deepspeed)")
    except Exception as e:  # pydantic validation error: unknown keys, bad values
        problems.append(f"zero_optimization: {str(e).splitlines()[0]} ({'; '.join(str(e).splitlines()[1:3])})")
    if problems:
        raise UsageError(
            f"invalid DeepSpeed config ({spec}):\n  " + "\n  ".join(problems),
            "a DeepSpeed config without optimizer/scheduler sections; batch sizes 'auto'",
            "start from a preset: --deepspeed zero2",
        )
    resolved = {k: v for k, v in user.items() if k not in _OURS}
    resolved.update(
        train_micro_batch_size_per_gpu=1,  # batches are token-budgeted; DeepSpeed's count is nominal
        gradient_accumulation_steps=cfg.grad_accum,
        gradient_clipping=cfg.grad_clip,
        zero_allow_untested_optimizer=True,
        steps_per_print=10**9,
    )
    section = dict(resolved.get("bf16") or {})
    if section.get("enabled", "auto") == "auto":
        section["enabled"] = bf16
    resolved["bf16"] = section
    return resolved


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg: TrainConfig) -> Path:
    """Check everything cheap, write the resolved configs, run the deepspeed launcher, wait."""
    from ..model.target import pick_device, pick_dtype

    run_dir = Path(cfg.run)
    train_dir = run_dir / "train"
    cache_dir = cfg.cache or run_dir / "cache"
    if not cfg.online and not (Path(cache_dir) / "manifest.json").exists():
        raise UsageError(
            f"no finished cache at {cache_dir}", "the output folder of `eagle3 cache`", f"eagle3 cache --run {run_dir}"
        )
    if cfg.hostfile is not None and not Path(cfg.hostfile).is_file():
        raise UsageError(f"--hostfile {cfg.hostfile} does not exist", "an MPI-style hostfile (host slots=N)")
    device = pick_device(cfg.device)
    ds = deepspeed_config(
        cfg,
        bf16=pick_dtype(device, cfg.dtype).is_floating_point
        and device.type == "cuda"
        and cfg.dtype not in ("fp32", "float32"),
    )
    launcher = shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")
    if not Path(launcher).exists():
        raise UsageError("the `deepspeed` launcher is not on PATH", "pip install deepspeed", "eagle3 doctor")
    train_dir.mkdir(parents=True, exist_ok=True)
    ds_path = train_dir / "deepspeed_config.json"
    atomic_write_json(ds_path, ds)
    child = config_dict(cfg) | {"deepspeed": str(ds_path.resolve())}
    child = {k: v for k, v in child.items() if v is not None}
    recipe = train_dir / "launch.yaml"
    atomic_write_text(recipe, "# written by `eagle3 train --deepspeed`; each rank reads it\n" + yaml.safe_dump(child))
    cmd = [launcher, "--no_local_rank", "--module", "--master_port", str(_free_port())]
    if cfg.hostfile is not None:
        cmd += ["--hostfile", str(cfg.hostfile)]
    cmd += ["--num_gpus", str(cfg.nproc), "eagle3cli", "train", "--recipe", str(recipe.resolve())]
    console.log("launching: " + " ".join(cmd))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise UsageError(
            f"the DeepSpeed run failed (exit {rc}); its ranks' messages are above",
            None,
            f"fix the cause and re-run the same command (it resumes from {train_dir}/checkpoints)",
        )
    return run_dir / "head"


def deepspeed_engine(draft, optimizer, scheduler, cfg: TrainConfig, train_dir: Path, bf16: bool):
    """(engine, optimizer, scheduler) on this rank; the config file is the launcher's resolved one."""
    import deepspeed

    ds = read_json(Path(cfg.deepspeed)) if Path(str(cfg.deepspeed)).is_file() else deepspeed_config(cfg, bf16)
    deepspeed.init_distributed(dist_backend=None)
    engine, opt, _, sched = deepspeed.initialize(
        model=draft,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=ds,
        model_parameters=[p for p in draft.parameters() if p.requires_grad],
    )
    return engine, opt, sched


@contextmanager
def gathered_params(engine, draft):
    """Full parameters on every rank for the export (ZeRO-3 partitions them; 1/2 keep them whole)."""
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else 0
    if stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(draft.parameters()), modifier_rank=None):
            yield
    else:
        yield
