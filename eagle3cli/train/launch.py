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
import re
import shlex
import shutil
import socket
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from .. import console
from ..config import config_dict
from ..errors import StageError, UsageError
from ..run_folder.manifest import atomic_write_json, atomic_write_text, read_json, read_json_object
from .config import DEEPSPEED_PRESETS, TrainConfig

# Sections whose values eagle3 sets from its own flags; "auto" in a user config means "take the flag".
_OURS = {"gradient_accumulation_steps", "gradient_clipping", "train_micro_batch_size_per_gpu", "train_batch_size"}
_REFUSED = {
    "optimizer": "--lr/--weight-decay (eagle3 uses AdamW)",
    "scheduler": "--warmup-ratio/--min-lr-ratio (eagle3 uses warmup + cosine)",
    "fp16": "bf16 (fp16 loss scaling is not supported)",
}


def preset_path(name: str) -> Path:
    """The DeepSpeed config a preset name stands for (package data: works from a wheel too)."""
    return Path(str(resources.files("eagle3cli.train") / "presets" / f"{name}.json"))


def deepspeed_config(cfg: TrainConfig, bf16: bool) -> dict:
    """The resolved DeepSpeed config for a preset name or a JSON file, checked before any launch."""
    spec = cfg.deepspeed
    # a preset is a config file shipped in the package: eagle3cli/train/presets/NAME.json
    path = preset_path(spec) if spec in DEEPSPEED_PRESETS else Path(str(spec))
    if not path.is_file():
        raise UsageError(
            f"--deepspeed {spec!r} is neither a preset nor a file",
            f"one of {', '.join(DEEPSPEED_PRESETS)} or a DeepSpeed config JSON",
            "eagle3 train --run runs/NAME --deepspeed zero2 --nproc 2",
        )
    user = read_json_object(path, "a DeepSpeed config (a JSON object)", "start from a preset: --deepspeed zero2")
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
    if section["enabled"] is True:
        refuse_buffer_casting_deepspeed(spec)
    return resolved


# DeepSpeed before 0.19.2 (PR 8066) cast the whole module to bf16, buffers included: RoPE's fp32
# `inv_freq` rounded to bf16 puts the draft's positions off by whole angles at long contexts.
BF16_KEEPS_BUFFERS = (0, 19, 2)


def refuse_buffer_casting_deepspeed(spec) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version("deepspeed")
    except PackageNotFoundError:
        return  # said by the config check above
    parts = tuple(int(x) for x in re.findall(r"\d+", have)[:3])
    if parts < BF16_KEEPS_BUFFERS:
        raise UsageError(
            f"--deepspeed {spec} with bf16: deepspeed {have} casts the draft's buffers (RoPE's inv_freq) to bf16",
            "deepspeed >= 0.19.2, which casts parameters only",
            "pip install 'deepspeed>=0.19.2'   (or train in fp32: --dtype fp32)",
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- multi-node
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
# Run on the master node through ssh: a port that is free THERE (a port free on the launching
# host says nothing about the master node, which may be another machine).
_PORT_PROBE = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
_SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


def parse_hostfile(path: Path) -> dict[str, int]:
    """`host slots=N` lines (DeepSpeed's / MPI's format; `#` comments) -> {host: slots}, in order."""
    hosts: dict[str, int] = {}
    expected = "one `HOST slots=N` line per node (N >= 1 processes), e.g. `node-1 slots=8`"
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        if not m or int(m.group(2)) < 1:
            raise UsageError(f"--hostfile {path} line {n} is not `HOST slots=N`: {raw.strip()!r}", expected)
        if m.group(1) in hosts:
            raise UsageError(f"--hostfile {path} names {m.group(1)} twice (line {n})", expected)
        hosts[m.group(1)] = int(m.group(2))
    if not hosts:
        raise UsageError(f"--hostfile {path} names no host", expected)
    return hosts


def _is_local(host: str) -> bool:
    return host in _LOCAL_HOSTS or host in (socket.gethostname(), socket.getfqdn())


@dataclass(frozen=True)
class LaunchPlan:
    """Who runs how many ranks, and where they meet."""

    procs: dict[str, int]  # host -> processes on it (DeepSpeed's --num_gpus caps every host)
    multi_node: bool
    master_addr: str | None  # None: DeepSpeed asks the first host (`ssh HOST hostname -I`)
    master_port: int

    @property
    def world_size(self) -> int:
        return sum(self.procs.values())


def plan_processes(cfg: TrainConfig) -> dict[str, int]:
    """Processes per host: --nproc (default 1) on this machine; with --hostfile each host's slots,
    capped at --nproc when it is given."""
    if cfg.hostfile is None:
        return {"localhost": cfg.nproc or 1}
    hosts = parse_hostfile(cfg.hostfile)
    if cfg.nproc is not None:
        short = {h: s for h, s in hosts.items() if s < cfg.nproc}
        if short:
            raise UsageError(
                f"--nproc {cfg.nproc} but --hostfile {cfg.hostfile} gives "
                + ", ".join(f"{h} slots={s}" for h, s in short.items()),
                "--nproc at most the smallest slots=N (it caps the processes of every node)",
                "drop --nproc to use every slot, or raise slots= in the hostfile",
            )
        return {h: cfg.nproc for h in hosts}
    return hosts


def _ssh(host: str, command: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([*_SSH, host, command], capture_output=True, text=True, timeout=timeout)


def check_nodes(hosts: list[str], recipe: Path) -> None:
    """Every node must run this venv's python and see the run folder (shared filesystem): the
    launcher starts `cd CWD; PYTHON -m deepspeed.launcher.launch ...` on each with pdsh over ssh."""
    for tool, why in (("pdsh", "DeepSpeed starts the other nodes' ranks with pdsh"), ("ssh", "pdsh uses ssh")):
        if shutil.which(tool) is None:
            raise UsageError(
                f"multi-node training needs `{tool}` on this machine ({why})",
                "pdsh and passwordless ssh from this machine to every node in the hostfile",
                "apt-get install pdsh openssh-client   (see docs/train.md, multi-node)",
            )
    python, cwd = shlex.quote(sys.executable), shlex.quote(os.getcwd())
    probe = (
        f"test -x {python} || echo NO_PYTHON; test -r {shlex.quote(str(recipe))} || echo NO_RUN; "
        f"test -d {cwd} || echo NO_CWD"
    )
    for host in hosts:
        try:
            r = _ssh(host, probe)
        except subprocess.TimeoutExpired:
            r = None
        if r is None or r.returncode != 0:
            detail = "timed out" if r is None else (r.stderr.strip() or f"exit {r.returncode}")[:300]
            raise UsageError(
                f"cannot reach {host} with passwordless ssh ({detail})",
                "`ssh HOST true` works without a password prompt for every host in the hostfile",
                f"ssh {host} true   (set up keys / ~/.ssh/config, then re-run)",
            )
        missing = r.stdout.split()
        if "NO_PYTHON" in missing:
            raise UsageError(
                f"{host} has no {sys.executable}: every node runs the launcher's python by its path",
                "the same virtualenv at the same path on every node (e.g. on the shared filesystem)",
                f"create it on {host} at {sys.executable}, or run from a venv on shared storage",
            )
        if "NO_RUN" in missing or "NO_CWD" in missing:
            what = recipe if "NO_RUN" in missing else os.getcwd()
            raise UsageError(
                f"{host} cannot see {what}: the run folder and the working directory must be on a filesystem "
                f"every node mounts at the same path",
                "--run and the current directory on shared storage (NFS, Lustre, ...)",
                "move the run folder to shared storage and launch from there",
            )


def master_port_on(host: str) -> int:
    """A port free on the master node, asked on that node."""
    try:
        r = _ssh(host, f"{shlex.quote(sys.executable)} -c {shlex.quote(_PORT_PROBE)}")
        port = int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    except (subprocess.TimeoutExpired, ValueError):
        port = None
    if port is None:
        raise UsageError(
            f"could not pick a free port on the master node {host} over ssh",
            "a reachable master node, or an explicit --master-port",
            f"eagle3 train ... --master-port 29500   (a port open between the nodes on {host})",
        )
    return port


def plan_launch(cfg: TrainConfig, recipe: Path) -> LaunchPlan:
    procs = plan_processes(cfg)
    hosts = list(procs)
    multi = len(hosts) > 1 or not _is_local(hosts[0])
    if not multi:
        return LaunchPlan(procs, False, None, cfg.master_port or _free_port())
    check_nodes(hosts, recipe)
    return LaunchPlan(procs, True, cfg.master_addr, cfg.master_port or master_port_on(hosts[0]))


def launch_command(cfg: TrainConfig, plan: LaunchPlan, launcher: str, recipe: Path) -> list[str]:
    cmd = [launcher, "--no_local_rank", "--module", "--master_port", str(plan.master_port)]
    if plan.master_addr:
        cmd += ["--master_addr", plan.master_addr]
    if plan.multi_node:
        assert cfg.hostfile is not None  # a multi-node plan comes from a hostfile
        cmd += ["--hostfile", str(Path(cfg.hostfile).resolve())]
        if cfg.nproc is not None:
            cmd += ["--num_gpus", str(cfg.nproc)]
    else:
        cmd += ["--num_gpus", str(plan.world_size)]
    return cmd + ["eagle3cli", "train", "--recipe", str(recipe.resolve())]


def launch(cfg: TrainConfig) -> Path:
    """Check everything cheap, write the resolved configs, run the deepspeed launcher, wait."""
    import torch

    from ..model.target import pick_device, pick_dtype

    run_dir = cfg.run_dir
    train_dir = run_dir / "train"
    cache_dir = cfg.cache or run_dir / "cache"
    if not cfg.online and not (Path(cache_dir) / "manifest.json").exists():
        raise UsageError(
            f"no finished cache at {cache_dir}", "the output folder of `eagle3 cache`", f"eagle3 cache --run {run_dir}"
        )
    if cfg.hostfile is not None and not Path(cfg.hostfile).is_file():
        raise UsageError(f"--hostfile {cfg.hostfile} does not exist", "an MPI-style hostfile (host slots=N)")
    plan_processes(cfg)  # a bad hostfile fails before anything is written
    if cfg.tensor_parallel_size > 1:  # heads the ranks cannot split: refused before any rank starts
        from ..model.sharded import check_shardable
        from ..model.target import resolve_model_path

        data = Path(cfg.data or run_dir / "data") / "manifest.json"
        ref = cfg.target or ((read_json(data).get("target") or {}).get("path") if data.is_file() else None)
        if ref:  # none: the ranks say what is missing
            check_shardable(resolve_model_path(ref), cfg.tensor_parallel_size)
    device = pick_device(cfg.device)
    # DeepSpeed's bf16 mode on GPUs only; on CPU a bf16 run autocasts (train/loop.py)
    ds = deepspeed_config(cfg, bf16=device.type == "cuda" and pick_dtype(device, cfg.dtype) == torch.bfloat16)
    launcher = shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")
    if not Path(launcher).exists():
        raise UsageError("the `deepspeed` launcher is not on PATH", "pip install deepspeed", "eagle3 doctor")
    train_dir.mkdir(parents=True, exist_ok=True)
    ds_path = train_dir / "deepspeed_config.json"
    atomic_write_json(ds_path, ds)
    # Relative paths stay relative: the launcher starts every rank in this working directory
    # (`cd CWD` on each node), which check_nodes proves every node can see.
    child = config_dict(cfg) | {"deepspeed": str(ds_path.resolve())}
    child = {k: v for k, v in child.items() if v is not None}
    recipe = train_dir / "launch.yaml"
    # A `train:` section, not a flat recipe: flat keys such as `cache:` are also stage-section names.
    atomic_write_text(
        recipe, "# written by `eagle3 train --deepspeed`; each rank reads it\n" + yaml.safe_dump({"train": child})
    )
    plan = plan_launch(cfg, recipe)
    cmd = launch_command(cfg, plan, launcher, recipe)
    console.log(
        f"DeepSpeed: {plan.world_size} rank(s) on {len(plan.procs)} node(s) ("
        + ", ".join(f"{h}: {n}" for h, n in plan.procs.items())
        + f"); master {plan.master_addr or (next(iter(plan.procs)) if plan.multi_node else '127.0.0.1')}"
        f":{plan.master_port}"
    )
    console.log("launching: " + " ".join(cmd))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    head = run_dir / "head"
    marks = [head / "manifest.json", train_dir / "manifest.json"]
    before = [_stamp(p) for p in marks]
    was_finished = _finished_run(train_dir, head, child)
    ports = train_dir / SHM_RECORD
    stale = _recorded_port(ports)
    if stale is not None and not plan.multi_node:
        remove_shm_buffers(stale)  # a killed earlier launch of this run never cleaned up
    atomic_write_json(ports, {"master_port": plan.master_port})
    try:
        rc = subprocess.run(cmd, env=env).returncode
    finally:
        if not plan.multi_node:
            remove_shm_buffers(plan.master_port)
    if rc != 0:
        raise UsageError(
            f"the DeepSpeed run failed (exit {rc}); its ranks' messages are above",
            None,
            f"fix the cause and re-run the same command (it resumes from {train_dir}/checkpoints)",
        )
    fresh = all(_stamp(p) is not None and _stamp(p) != b for p, b in zip(marks, before))
    if not fresh and not (was_finished and _finished_run(train_dir, head, child)):
        # The launcher's exit code is not proof of work: pdsh and some launchers exit 0 when a
        # node's ranks never started or died without a status. (A rerun of a finished run leaves
        # its intact head as it is: that is success.)
        raise StageError(
            f"the DeepSpeed launcher exited 0 but no head was exported to {head} during this run",
            f"{head}/manifest.json and {train_dir}/manifest.json written by rank 0 at the end of training",
            f"check the ranks' output above (and every node's), then re-run the same command; it resumes "
            f"from {train_dir}/checkpoints",
        )
    return head


# DeepSpeed's CPU backend gives every rank a shared-memory all-reduce buffer (/dev/shm, ~66 MB per
# rank for a small head) that it never unlinks: each launch would leave them behind, in RAM, until
# reboot. They are named by the master port, which the run folder remembers.
SHM = Path("/dev/shm")
SHM_RECORD = "shm.json"


def _recorded_port(path: Path) -> int | None:
    try:
        port = json.loads(path.read_text()).get("master_port")
    except (OSError, ValueError, AttributeError):
        return None  # absent or torn: nothing to clean
    return port if isinstance(port, int) else None


def remove_shm_buffers(port: int) -> int:
    """Unlink this machine's DeepSpeed buffers of the launch on `port`, unless a live launch
    holds the port (then they are its own). Returns how many were removed."""
    with socket.socket() as probe:
        # SO_REUSEADDR: a port in TIME_WAIT (the launch just ended) binds; a live listener does not
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", int(port)))
        except OSError:
            return 0
    gone = 0
    for f in SHM.glob(f"deepspeed_allreduce_buffer_*_{int(port)}_*"):
        f.unlink(missing_ok=True)
        gone += 1
    return gone


# Settings that do not change what a run trains (the ranks' recipe may differ in them).
_NOT_RESULTS = ("resume", "hostfile", "master_addr", "master_port", "tensorboard", "log_every", "keep_checkpoints")


def _finished_run(train_dir: Path, head: Path, child: dict) -> bool:
    """A run that finished with these settings and whose exported head is intact."""
    from ..run_folder.manifest import verify_shards

    try:
        m, h = read_json(train_dir / "manifest.json"), read_json(head / "manifest.json")
    except (OSError, ValueError):
        return False
    if not h.get("shards") or verify_shards(head, h["shards"]):
        return False
    old = {k: v for k, v in (m.get("config") or {}).items() if v is not None and k not in _NOT_RESULTS}
    return old == {k: v for k, v in child.items() if k not in _NOT_RESULTS}


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """Identity of a file version: manifests are replaced atomically (a new inode), so a changed
    stamp means "rewritten", without trusting clocks of other nodes."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def deepspeed_engine(draft, optimizer, scheduler, cfg: TrainConfig, train_dir: Path, bf16: bool):
    """(engine, optimizer, scheduler) on this rank; the config file is the launcher's resolved one."""
    import deepspeed

    resolved = Path(str(cfg.deepspeed))  # the launcher's ranks get the resolved config file
    ds = read_json(resolved) if resolved.is_file() else deepspeed_config(cfg, bf16)
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
    """Full parameters on every rank (ZeRO-3 partitions them; 1/2 keep them whole). Collective."""
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else 0
    if stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(draft.parameters()), modifier_rank=None):
            yield
    else:
        yield


def gathered_copy(engine, draft, keep: bool):
    """A plain fp32 CPU copy of the trained draft (on the ranks with `keep`; None elsewhere).

    Every rank must call this (the gather is a collective). The copy is what gets exported and
    self-checked: it holds exactly the gathered values, and running it starts no collective.
    """
    from ..speculate.draft import Eagle3Draft

    with gathered_params(engine, draft):
        state = {k: v.detach().float().cpu().clone() for k, v in draft.state_dict().items()} if keep else None
    if state is None:
        return None
    copy = Eagle3Draft(draft.config)
    copy.load_state_dict(state)
    return copy.eval()
