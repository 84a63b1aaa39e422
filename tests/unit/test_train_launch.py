"""The DeepSpeed launch without training: recipes the ranks read, process counts per node from
hostfile slots, the master port asked on the master node, checks of every node, and a launch
that exports no head exiting non-zero. Multi-node runs through DeepSpeed's real launcher with
fake `pdsh` and `ssh` on PATH (they log what they were asked and run it on this machine)."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from train_fixtures import eagle3

from eagle3cli.config import build_config, load_recipe
from eagle3cli.errors import UsageError
from eagle3cli.train.config import TrainConfig
from eagle3cli.train.launch import launch_command, parse_hostfile, plan_launch, plan_processes

FAKE_SSH = r"""#!/bin/sh
# fake ssh: skip options, log "host<TAB>command<TAB>output", answer hostname queries, run the rest here
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
cmd="$*"
case "$cmd" in
  "hostname -I") out="127.0.0.1" ;;
  "hostname") out="$host" ;;
  *) out=$(sh -c "$cmd"); rc=$? ;;
esac
printf '%s\t%s\t%s\n' "$host" "$cmd" "$(echo $out | tr '\n' ' ')" >> "$FAKE_LOG_DIR/ssh.log"
[ "$FAKE_SSH_FAIL" = "$host" ] && exit 255
printf '%s\n' "$out"
exit ${rc:-0}
"""

FAKE_PDSH = r"""#!/bin/sh
# fake pdsh: record the argv (one JSON list) and start nothing
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$FAKE_LOG_DIR/pdsh.log"
exit 0
"""


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fake_cluster(tmp_path, monkeypatch):
    """PATH with fake pdsh/ssh, a run folder whose cache looks finished, and a log folder."""
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    _write_exe(bin_dir / "ssh", FAKE_SSH)
    _write_exe(bin_dir / "pdsh", FAKE_PDSH)
    run = tmp_path / "run"
    (run / "cache").mkdir(parents=True)
    (run / "cache" / "manifest.json").write_text("{}")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG_DIR": str(logs)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return run, logs, env


def _hostfile(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hostfile"
    p.write_text(text)
    return p


def _pdsh_calls(logs: Path) -> list[list[str]]:
    p = logs / "pdsh.log"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def _ssh_log(logs: Path) -> list[tuple[str, str, str]]:
    return [tuple(line.split("\t")) for line in (logs / "ssh.log").read_text().splitlines()]


def _flag(argv: list[str], name: str) -> str:
    hit = [a for a in argv if a.startswith(f"--{name}=")]
    assert hit, f"--{name} missing from {argv}"
    return hit[0].split("=", 1)[1]


# ---------------------------------------------------------------- recipes
def test_flat_recipe_with_a_cache_key_is_a_flat_recipe(tmp_path):
    """The launch.yaml bug: `cache:` is a train key and a stage-section name."""
    flat = tmp_path / "flat.yaml"
    flat.write_text("run: runs/x\ncache: /data/cache\nlr: 0.001\n")
    cfg = build_config(TrainConfig, flat, "train")
    assert cfg.run == Path("runs/x") and cfg.cache == Path("/data/cache") and cfg.lr == 0.001
    sectioned = tmp_path / "sections.yaml"
    sectioned.write_text("cache:\n  max_length: 64\ntrain:\n  lr: 0.002\n")
    assert load_recipe(sectioned, "train") == {"lr": 0.002}
    assert load_recipe(sectioned, "cache") == {"max_length": 64}
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("train:\n  lr: 0.002\nrun: runs/x\n")
    with pytest.raises(UsageError, match="mixes stage sections"):
        load_recipe(mixed, "train")


# ---------------------------------------------------------------- process counts
def test_hostfile_slots_give_the_processes_per_node(tmp_path):
    hf = _hostfile(tmp_path, "# two nodes\nnode-a slots=8\nnode-b slots=8   # trailing comment\n\n")
    assert parse_hostfile(hf) == {"node-a": 8, "node-b": 8}
    cfg = build_config(TrainConfig, None, "train", run="r", deepspeed="zero2", hostfile=hf)
    assert plan_processes(cfg) == {"node-a": 8, "node-b": 8}  # no --nproc: every slot, not 1
    capped = build_config(TrainConfig, None, "train", run="r", deepspeed="zero2", hostfile=hf, nproc=4)
    assert plan_processes(capped) == {"node-a": 4, "node-b": 4}
    too_many = build_config(TrainConfig, None, "train", run="r", deepspeed="zero2", hostfile=hf, nproc=16)
    with pytest.raises(UsageError, match="--nproc 16 but"):
        plan_processes(too_many)
    single = build_config(TrainConfig, None, "train", run="r", deepspeed="zero2")
    assert plan_processes(single) == {"localhost": 1}


@pytest.mark.parametrize(
    "text,match",
    [
        ("node-a\n", "not `HOST slots=N`"),
        ("node-a slots=0\n", "not `HOST slots=N`"),
        ("node-a slots=2\nnode-a slots=2\n", "names node-a twice"),
        ("# nothing\n", "names no host"),
    ],
)
def test_bad_hostfiles_are_refused_before_launch(tmp_path, text, match):
    with pytest.raises(UsageError, match=match):
        parse_hostfile(_hostfile(tmp_path, text))


def test_single_node_command_passes_the_process_count(tmp_path):
    cfg = build_config(TrainConfig, None, "train", run="r", deepspeed="zero2", nproc=2)
    plan = plan_launch(cfg, tmp_path / "launch.yaml")
    assert not plan.multi_node and plan.world_size == 2
    cmd = launch_command(cfg, plan, "deepspeed", tmp_path / "launch.yaml")
    assert cmd[cmd.index("--num_gpus") + 1] == "2" and "--hostfile" not in cmd


def test_multi_node_checks_every_node_and_asks_the_master_for_its_port(tmp_path, fake_cluster):
    run, logs, _ = fake_cluster
    recipe = run / "launch.yaml"
    recipe.write_text("train: {}\n")
    hf = _hostfile(tmp_path, "node-a slots=2\nnode-b slots=2\n")
    cfg = build_config(TrainConfig, None, "train", run=run, deepspeed="zero2", hostfile=hf)
    plan = plan_launch(cfg, recipe)
    assert plan.multi_node and plan.procs == {"node-a": 2, "node-b": 2} and plan.world_size == 4
    calls = _ssh_log(logs)
    assert {h for h, _, _ in calls} == {"node-a", "node-b"}  # both nodes checked
    port_calls = [(h, out) for h, cmd, out in calls if "getsockname" in cmd]
    assert [h for h, _ in port_calls] == ["node-a"]  # asked on the master node, nobody else
    assert plan.master_port == int(port_calls[0][1].strip())
    cmd = launch_command(cfg, plan, "deepspeed", recipe)
    assert "--num_gpus" not in cmd and cmd[cmd.index("--hostfile") + 1] == str(hf.resolve())
    assert cmd[cmd.index("--master_port") + 1] == str(plan.master_port)


def test_multi_node_refuses_a_node_without_the_venv_or_the_run_folder(tmp_path, fake_cluster, monkeypatch):
    run, logs, _ = fake_cluster
    hf = _hostfile(tmp_path, "node-a slots=1\nnode-b slots=1\n")
    cfg = build_config(TrainConfig, None, "train", run=run, deepspeed="zero2", hostfile=hf)
    with pytest.raises(UsageError, match="cannot see .*launch.yaml.*filesystem every node mounts"):
        plan_launch(cfg, run / "launch.yaml")  # not written: as if the run folder were not shared
    (run / "launch.yaml").write_text("train: {}\n")
    monkeypatch.setenv("FAKE_SSH_FAIL", "node-b")
    with pytest.raises(UsageError, match="cannot reach node-b with passwordless ssh"):
        plan_launch(cfg, run / "launch.yaml")
    monkeypatch.delenv("FAKE_SSH_FAIL")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no pdsh
    if not any(Path(d, "pdsh").exists() for d in ("/usr/bin", "/bin")):
        with pytest.raises(UsageError, match="needs `pdsh`"):
            plan_launch(cfg, run / "launch.yaml")


FAKE_DEEPSPEED = r"""#!/bin/sh
# fake deepspeed launcher: exit 0; with FAKE_EXPORT=1 first write what rank 0 writes at the end
if [ "$FAKE_EXPORT" = 1 ]; then
  mkdir -p "$FAKE_RUN/head" && echo '{"schema_version": 1, "stage": "head"}' > "$FAKE_RUN/head/manifest.json" && echo '{}' > "$FAKE_RUN/train/manifest.json"
fi
exit 0
"""


def test_launch_that_exports_no_head_exits_nonzero(tmp_path, fake_cluster, monkeypatch, capsys):
    """The launcher's exit code 0 is not trusted: without a freshly written head, exit 2."""
    from eagle3cli.cli import main

    run, _, _ = fake_cluster
    _write_exe(tmp_path / "bin" / "deepspeed", FAKE_DEEPSPEED)
    monkeypatch.setenv("FAKE_RUN", str(run))
    (run / "head").mkdir()
    (run / "head" / "manifest.json").write_text(
        '{"schema_version": 1, "stage": "head"}'
    )  # an older head does not count
    assert main(["train", "--run", str(run), "--deepspeed", "zero2", "--nproc", "2"]) == 2
    assert "exited 0 but no head was exported" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_EXPORT", "1")
    assert main(["train", "--run", str(run), "--deepspeed", "zero2", "--nproc", "2"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("nproc,ranks", [(None, [0, 1]), (1, [0])])
def test_multi_node_launch_through_deepspeed_that_exports_no_head_exits_nonzero(tmp_path, fake_cluster, nproc, ranks):
    """DeepSpeed's real launcher, fake pdsh that starts nothing: the per-node ranks and the master
    port reach pdsh's command, and eagle3 does not report success without a head."""
    run, logs, _ = fake_cluster
    hf = _hostfile(tmp_path, "node-a slots=2\nnode-b slots=2\n")
    flags = ["--run", run, "--deepspeed", "zero2", "--hostfile", hf] + (["--nproc", str(nproc)] if nproc else [])
    r = eagle3("train", *flags, timeout=240)
    err = r.stdout + r.stderr
    assert r.returncode == 2, err[-3000:]
    assert "exited 0 but no head was exported" in err and "Traceback" not in err
    (argv,) = _pdsh_calls(logs)
    assert argv[argv.index("-w") + 1] == "node-a,node-b"
    world = json.loads(base64.urlsafe_b64decode(_flag(argv, "world_info")))
    assert world == {"node-a": ranks, "node-b": ranks}
    probed = [out for h, cmd, out in _ssh_log(logs) if "getsockname" in cmd and h == "node-a"]
    assert _flag(argv, "master_port") == probed[-1].strip()
    assert _flag(argv, "master_addr") == "127.0.0.1"  # DeepSpeed's `ssh node-a hostname -I`
    recipe = Path(argv[-1])
    assert argv[-4:-1] == ["eagle3cli", "train", "--recipe"] and recipe.is_absolute()
    cfg = build_config(TrainConfig, recipe, "train")  # what every rank reads
    assert cfg.run == run and cfg.deepspeed.endswith("deepspeed_config.json")
