"""The CUDA path, imitated on CPU (tests/gpu_imitation.py), one test class per finding of issue 65;
the `gpu` tests at the end run the same chain on a real GPU wherever one exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from gpu_imitation import AcceleratorDraws, fake_cuda

from eagle3cli.model.target import load_target
from eagle3cli.speculate import verify_chain_sampling, verify_tree_sampling
from eagle3cli.speculate.aux_layers import default_aux_layer_ids
from eagle3cli.speculate.decoder import SpeculativeDecoder, plain_decode
from eagle3cli.speculate.draft import Eagle3Draft, draft_config_from_target

PACKAGE = Path(__file__).resolve().parents[2] / "eagle3cli"
PYPROJECT = (PACKAGE.parent / "pyproject.toml").read_text()


@pytest.fixture
def accelerator_draws(monkeypatch) -> AcceleratorDraws:
    return AcceleratorDraws(monkeypatch)


def floor_of(requirement: str) -> tuple[int, ...]:
    """The `>=` floor of the pyproject requirement starting with `requirement` (e.g. "torch>=")."""
    m = re.search(r'"' + re.escape(requirement) + r"(\d+(?:\.\d+)*)", PYPROJECT)
    assert m, requirement
    return tuple(int(x) for x in m.group(1).split("."))


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    model, tok, _ = load_target(tiny_target_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True, tokenize=True)
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_config_from_target(model.config, model.config.vocab_size, aux)).eval()
    return model, draft, aux, prompt


# ---------------------------------------------------------------- 1. draws on the device of what they sample
@pytest.mark.parametrize("temperature,top_p", [(0.8, 1.0), (1.0, 0.9)])
def test_sampled_decoding_draws_with_a_generator_of_the_tensors_device(tiny, accelerator_draws, temperature, top_p):
    """Plain decoding, both speculative modes and the sampling check draw only with generators made
    for the device of what they sample (on a GPU the old host generators raised at the first draw)."""
    from eagle3cli.eval.losslessness import sampling_check

    model, draft, aux, prompt = tiny
    for mode in ("chain", "tree"):
        dec = SpeculativeDecoder(model, draft, aux, mode=mode, depth=3, topk=2, num_draft_tokens=4,
                                 temperature=temperature, top_p=top_p)  # fmt: skip
        assert len(dec.generate(prompt, 6, seed=1).tokens) == 6
    check = sampling_check(model, dec, prompt, set(), draws=2, positions=3, temperature=temperature, top_p=top_p)
    assert check["draws"] == 2
    assert accelerator_draws.draws > 20


def test_plain_sampling_is_seeded_on_the_models_device(tiny, accelerator_draws):
    """plain_decode takes a seed, not a generator: it makes its own for the model's device."""
    model, _, _, prompt = tiny
    a, b = (plain_decode(model, prompt, 8, set(), 1.0, 1.0, seed=3).tokens for _ in range(2))
    assert a == b != plain_decode(model, prompt, 8, set(), 1.0, 1.0, seed=4).tokens


def test_verification_draws_on_the_probabilities_device(accelerator_draws):
    """The verifiers draw their uniforms where the probabilities are, for any generator made by
    `generator_for` that device's; a host generator is what a GPU refuses."""
    from eagle3cli.speculate import generator_for

    g = generator_for("cpu", 0)
    p = torch.softmax(torch.randn(4, 10), -1)
    q = torch.softmax(torch.randn(3, 10), -1)
    a, out = verify_chain_sampling(torch.tensor([1, 2, 3]), q, p, g)
    assert 0 <= a <= 3 and out.shape == (a + 1,)
    path, out = verify_tree_sampling(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 0]), p, g)
    assert out.shape == (len(path) + 1,)
    with pytest.raises(RuntimeError, match="device type for generator"):
        verify_chain_sampling(torch.tensor([1, 2, 3]), q, p, torch.Generator())


def test_the_package_makes_generators_in_one_place():
    """`torch.Generator(` is called in speculate/sampling.py's `generator_for` alone, so no draw can
    take a generator made for another device than the tensor it samples."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.Generator":
                found.append(str(path.relative_to(PACKAGE)))
    assert found == ["speculate/sampling.py"], found


# ---------------------------------------------------------------- 2. RNG states per GPU that exists
@pytest.mark.parametrize("saved,now", [(4, 1), (2, 1), (1, 2), (3, 3)])
def test_resume_restores_a_cuda_rng_state_per_gpu_that_exists(monkeypatch, saved, now):
    """A checkpoint from `saved` GPUs resumed where `now` are visible: each existing GPU gets its
    own saved state, no IndexError, and one line says when the counts differ."""
    from eagle3cli.train import checkpoint as ckpt

    cuda = fake_cuda(monkeypatch, saved)
    state = ckpt.rng_state()
    assert len(state["cuda"]) == saved
    cuda.n, cuda.states = now, {}
    said = ckpt.set_rng_state(state)
    assert sorted(cuda.states) == list(range(min(saved, now)))
    assert all(torch.equal(cuda.states[i], state["cuda"][i]) for i in cuda.states)
    if saved == now:
        assert said is None
    else:
        assert f"for {saved} GPU(s), this process sees {now}" in said


# ---------------------------------------------------------------- 6. cache --shard i/N spreads over the GPUs
class _Opened(Exception):
    pass


@pytest.mark.parametrize(
    "shard,gpus,device,expected",
    [("0/2", 2, None, "cuda:0"), ("1/2", 2, None, "cuda:1"), ("3/4", 2, None, "cuda:1"), ("5/8", 3, None, "cuda:2"),
     ("1/2", 2, "cuda:0", "cuda:0"), ("1/2", 2, "cpu", "cpu"), ("1/2", 0, None, None)],
)  # fmt: skip
def test_cache_shard_without_device_runs_on_gpu_i_mod_count(
    tmp_path, tiny_target_dir, monkeypatch, shard, gpus, device, expected
):
    """`cache --shard i/N` loads the target on cuda:(i mod GPUs) unless --device names one (faked GPUs:
    the target is not loaded, the device it would be loaded on is recorded)."""
    from cache_fixtures import conversations, write_data_folder

    from eagle3cli.cache import run as cache_run
    from eagle3cli.cache.config import CacheConfig
    from eagle3cli.config import build_config

    data = write_data_folder(tmp_path / "data", tiny_target_dir, conversations(12))
    if gpus:
        fake_cuda(monkeypatch, gpus)
        monkeypatch.setattr(
            "eagle3cli.node.devices.available_devices", lambda: ["cpu", "cuda", *(f"cuda:{i}" for i in range(gpus))]
        )
    seen = []

    real = cache_run.open_target

    def opened(path, load=False, device=None, dtype=None):
        if not load:  # the target's identity and tokenizer, read before any shard
            return real(path)
        seen.append(device)
        raise _Opened

    monkeypatch.setattr(cache_run, "open_target", opened)
    flags = dict(
        data=data, out=tmp_path / "c", target=str(tiny_target_dir), shard=shard, max_length=128, shard_tokens=64
    )
    cfg = build_config(CacheConfig, None, "cache", **flags, **({"device": device} if device else {}))
    with pytest.raises(_Opened):
        cache_run.run_cache(cfg)
    assert seen == [expected]


# ---------------------------------------------------------------- 5. self-check bound by dtype and matmul precision
@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_target_dir):
    from train_fixtures import make_run

    return make_run(tmp_path_factory.mktemp("gpu-train") / "base", tiny_target_dir, n=16)


@pytest.fixture
def float32_matmul_precision():
    before, tf32 = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    yield torch.set_float32_matmul_precision
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("precision,exported", [("medium", True), ("highest", False)])
def test_export_self_check_bound_follows_the_matmul_precision(
    tmp_path, base_run, monkeypatch, float32_matmul_precision, precision, exported
):
    """A reload that agrees to reduced-precision rounding (weights rounded to bf16: what matmuls at
    "medium" fp32 precision compute, and TF32's order of error) passes the export check under reduced
    precision and fails it under IEEE fp32; the run ends with its manifest only when it passes."""
    from train_fixtures import copy_run, fast_train_config

    from eagle3cli.errors import StageError
    from eagle3cli.head import write
    from eagle3cli.train.loop import finish, fit, setup

    real = write.load_any_head

    def rounded(path, *a, **kw):
        out = real(path, *a, **kw)
        with torch.no_grad():
            for p in out[0].parameters():
                p.copy_(p.to(torch.bfloat16).float())
        return out

    monkeypatch.setattr(write, "load_any_head", rounded)
    run = copy_run(base_run, tmp_path / "run")
    float32_matmul_precision(precision)
    tr = setup(fast_train_config(run, max_steps=2, log_every=2, save_every=2, ttt_steps=2))
    fit(tr)
    if exported:
        finish(tr)
        man = (run / "train" / "manifest.json").read_text()
        assert 0 < __import__("json").loads(man)["export_self_check_max_abs_diff"] < 1
    else:
        with pytest.raises(StageError, match="reproduces the trained logits only to"):
            finish(tr)
        assert not (run / "train" / "manifest.json").exists()


def test_matmul_precision_follows_dtype_and_tf32(float32_matmul_precision):
    from eagle3cli.node.devices import matmul_precision

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    assert [matmul_precision(torch.float32, d) for d in (cuda, cpu)] == ["fp32", "fp32"]
    assert matmul_precision(torch.bfloat16, cpu) == "bf16" and matmul_precision(torch.float16, cuda) == "fp16"
    torch.backends.cuda.matmul.allow_tf32 = True  # common CUDA containers' default
    assert [matmul_precision(torch.float32, d) for d in (cuda, cpu)] == ["tf32", "fp32"]
    torch.backends.cuda.matmul.allow_tf32 = False
    float32_matmul_precision("high")
    assert matmul_precision(torch.float32, cuda) == "tf32"


# ---------------------------------------------------------------- 3. DeepSpeed bf16 keeps fp32 buffers
def _ds_cfg(tmp_path, preset="zero2"):
    from eagle3cli.config import build_config
    from eagle3cli.train.config import TrainConfig

    return build_config(TrainConfig, None, "train", run=tmp_path / "run", deepspeed=preset)


@pytest.mark.parametrize("have,refused", [("0.16.0", True), ("0.19.1", True), ("0.19.2", False), ("0.20.0rc1", False)])
def test_deepspeed_bf16_refuses_a_version_that_casts_buffers(tmp_path, monkeypatch, have, refused):
    """bf16 with a DeepSpeed that casts buffers exits 2 naming the floor; fp32 runs need no floor."""
    import importlib.metadata

    from eagle3cli.errors import UsageError
    from eagle3cli.train.launch import deepspeed_config

    monkeypatch.setattr(importlib.metadata, "version", lambda name: have)
    cfg = _ds_cfg(tmp_path)
    assert deepspeed_config(cfg, bf16=False)["bf16"]["enabled"] is False
    if refused:
        with pytest.raises(UsageError, match=r"deepspeed>=0\.19\.2"):
            deepspeed_config(cfg, bf16=True)
    else:
        assert deepspeed_config(cfg, bf16=True)["bf16"]["enabled"] is True


def test_pyproject_deepspeed_floor_keeps_buffers():
    from eagle3cli.train.launch import BF16_KEEPS_BUFFERS

    assert floor_of("deepspeed>=") >= BF16_KEEPS_BUFFERS == (0, 19, 2)


@pytest.mark.slow
def test_deepspeed_bf16_engine_on_cpu_keeps_rope_buffers_fp32(tmp_path, tiny, monkeypatch):
    """The engine our DeepSpeed path builds, in bf16 on DeepSpeed's CPU accelerator: parameters bf16,
    RoPE's inv_freq still fp32, and a training step runs."""
    from eagle3cli.engines.local_engine import free_port
    from eagle3cli.train.launch import deepspeed_engine

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    model, _, aux, _ = tiny
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_config_from_target(model.config, 64, aux))
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    engine, _, _ = deepspeed_engine(draft, opt, sched, _ds_cfg(tmp_path), tmp_path, bf16=True)
    assert draft.fc.weight.dtype == torch.bfloat16
    assert draft.rotary_emb.inv_freq.dtype == torch.float32
    ids = torch.randint(0, 64, (1, 8))
    hid = torch.randn(1, 8, len(aux) * model.config.hidden_size, dtype=torch.bfloat16)
    h = list(draft.ttt_unroll(ids, hid, steps=1))[-1]
    engine.backward(draft.logits(h).float().logsumexp(-1).mean())
    engine.step()


# ---------------------------------------------------------------- 8. budgets in wall seconds, --compile, doctor, floors, dtypes
def test_time_budget_counts_wall_seconds_of_a_device_bound_step(tmp_path, base_run, monkeypatch):
    """A step whose time is spent waiting on the device (a sleep: the process's CPU idles) ends a
    --time-budget-s run on wall seconds; --time-clock cpu keeps counting core-seconds."""
    import time

    from train_fixtures import copy_run, fast_train_config

    from eagle3cli.train import setup as train_setup
    from eagle3cli.train.loop import fit

    real = train_setup.draft_ttt_loss

    def device_bound(*a, **kw):
        time.sleep(0.3)
        return real(*a, **kw)

    run = copy_run(base_run, tmp_path / "run")
    tr = train_setup.setup(fast_train_config(run, time_budget_s=1.0, save_every=1000, log_every=1))
    tr.loss_fn = device_bound
    fit(tr)
    assert "time budget (1 wall s" in tr.stopped and tr.clock.seconds >= 1.0
    # every step waits 0.3 wall seconds: the wall budget is spent by step 4 whatever the CPU's speed
    # (the step's core-seconds, what the old clock counted, are a small part of it)
    assert 1 <= tr.loop.step <= 4


# The torch calls the package makes that a release introduced: the floor must admit none without them.
TORCH_SINCE = {
    "torch.optim.Muon": (2, 9),
    "get_total_norm": (2, 6),
    "enable_gqa": (2, 5),
    "torch.OutOfMemoryError": (2, 5),
}


def test_pyproject_torch_floor_covers_what_the_code_calls():
    floor = floor_of("torch>=")[:2]
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    used = {api: since for api, since in TORCH_SINCE.items() if api in source}
    assert "torch.optim.Muon" in used  # the table is read against real calls
    assert all(floor >= since for since in used.values()), (floor, used)


@pytest.fixture
def two_gpus(monkeypatch, tmp_path):
    """An A100 (sm_80) and a V100 (sm_70) as torch would report them, and the driver's nvidia-smi."""
    from types import SimpleNamespace

    fake_cuda(monkeypatch, 2)
    caps = {0: ("NVIDIA A100-SXM4-80GB", 8, 0), 1: ("Tesla V100-SXM2-16GB", 7, 0)}
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(name=caps[i][0], major=caps[i][1], minor=caps[i][2]),
    )
    monkeypatch.setattr(
        torch.cuda,
        "get_device_capability",
        lambda i=None: caps[torch.device(i).index if isinstance(i, (str, torch.device)) else i or 0][1:],
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: caps[i or 0][0])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda i: (70 * 2**30, 80 * 2**30) if i == 0 else (15 * 2**30, 16 * 2**30)
    )
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 570.86.15\necho 570.86.15\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{__import__('os').environ['PATH']}")


def test_doctor_has_a_row_per_gpu_and_the_cuda_driver_nccl_versions(two_gpus):
    from eagle3cli.doctor import check_devices, torch_answers

    rows = {r.name: r.detail for r in check_devices(torch_answers(deepspeed=False))}
    assert rows["cuda"] == "CUDA 12.8, driver 570.86.15, NCCL 2.27.3"
    assert rows["cuda:0"].startswith("NVIDIA A100-SXM4-80GB, compute capability 8.0, 80.0 GiB (70.0 free), bf16 yes")
    assert rows["cuda:1"].startswith("Tesla V100-SXM2-16GB, compute capability 7.0, 16.0 GiB (15.0 free), bf16 no")


def test_doctor_warns_of_a_cpu_torch_on_a_gpu_node(monkeypatch, tmp_path):
    from eagle3cli.doctor import check_devices, torch_answers

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    (row,) = [r for r in check_devices(torch_answers(deepspeed=False)) if r.name == "cuda"]
    assert (
        not row.ok
        and "NVIDIA GPUs" in row.detail
        and "is a CPU build" in row.detail
        and "pip install torch" in row.detail
    )


def test_auto_dtype_is_bf16_only_where_the_gpu_supports_it(two_gpus, capsys):
    from eagle3cli.model.target import pick_dtype
    from eagle3cli.node import devices

    getattr(devices, "_SAID", set()).clear()
    assert pick_dtype(torch.device("cuda", 0)) == torch.bfloat16
    assert pick_dtype(torch.device("cuda", 1)) == torch.float16 == pick_dtype(torch.device("cuda", 1))
    said = capsys.readouterr()
    assert (said.out + said.err).count("has no bf16") == 1  # once per device
    assert pick_dtype(torch.device("cuda", 1), "fp32") == torch.float32


@pytest.mark.parametrize(
    "has_triton,cc,refused", [(False, True, "needs Triton"), (True, False, "needs a C compiler"), (True, True, None)]
)
def test_compile_on_cuda_checks_triton_and_a_c_compiler_first(tmp_path, monkeypatch, has_triton, cc, refused):
    """`--compile` on a CUDA device exits 2 before training when Triton or the C compiler it builds its
    launcher with is missing (the first step would fail minutes in, on a stack trace)."""
    import importlib.util
    from types import SimpleNamespace

    from eagle3cli.errors import UsageError
    from eagle3cli.train.setup import compiled_loss

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: SimpleNamespace() if n == "triton" and has_triton else (None if n == "triton" else real(n, *a)),
    )
    (tmp_path / "bin").mkdir()
    if cc:
        (tmp_path / "bin" / "gcc").write_text("#!/bin/sh\n")
        (tmp_path / "bin" / "gcc").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CC", raising=False)
    if refused:
        with pytest.raises(UsageError, match=refused) as e:
            compiled_loss(torch.device("cuda", 0))
        assert "or train without --compile" in str(e.value)
    else:
        assert callable(compiled_loss(torch.device("cuda", 0)))


# ---------------------------------------------------------------- 7. no host reads per micro-step; batches read ahead
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def _count_reads(monkeypatch, loop_mod):
    """Host reads of tensors made by eagle3's own code inside micro_step / optimizer_step on the loop's
    thread (each one a device sync on a GPU), per function."""
    import sys
    import threading

    counts = {"micro_step": 0, "optimizer_step": 0, "micro_steps": 0}
    inside: list[str] = []
    main = threading.current_thread()

    for name in READS:
        real = getattr(torch.Tensor, name)

        def read(self, *a, _real=real, **kw):
            caller = sys._getframe(1).f_code.co_filename
            if inside and threading.current_thread() is main and "eagle3cli" in caller:
                counts[inside[-1]] += 1
            return _real(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, read)
    for fn in ("micro_step", "optimizer_step"):
        real_fn = getattr(loop_mod, fn)

        def wrapped(*a, _real=real_fn, _fn=fn, **kw):
            inside.append(_fn)
            counts["micro_steps"] += _fn == "micro_step"
            try:
                return _real(*a, **kw)
            finally:
                inside.pop()

        monkeypatch.setattr(loop_mod, fn, wrapped)
    return counts


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_the_hot_loop_reads_no_tensor_per_micro_step(tmp_path, base_run, monkeypatch, grad_accum):
    """A micro-step reads nothing back from the device; an optimizer step reads once (its losses and
    gradient norm checked finite together, before the update)."""
    from train_fixtures import copy_run, fast_train_config

    from eagle3cli.train import loop

    counts = _count_reads(monkeypatch, loop)
    run = copy_run(base_run, tmp_path / "run")
    tr = loop.setup(fast_train_config(run, max_steps=4, grad_accum=grad_accum, log_every=4, save_every=4, ttt_steps=2))
    loop.fit(tr)
    assert counts["micro_steps"] == 4 * grad_accum
    assert counts["micro_step"] == 0
    assert counts["optimizer_step"] == 4


def test_prefetched_batches_train_exactly_as_batches_read_in_the_loop(tmp_path, base_run, monkeypatch):
    """--prefetch 2 (a background thread) and --prefetch 0 (read in the loop) give the same metrics
    and the same head, bit for bit, across an epoch boundary."""
    import json
    import threading

    from safetensors.torch import load_file
    from train_fixtures import copy_run, fast_train_config

    from eagle3cli.train import loop

    real, readers = loop.prepare, []
    monkeypatch.setattr(loop, "prepare", lambda *a: readers.append(threading.current_thread().name) or real(*a))
    out = {}
    for ahead in (0, 2):
        readers.clear()
        run = copy_run(base_run, tmp_path / f"run{ahead}")
        tr = loop.setup(
            fast_train_config(run, max_steps=9, grad_accum=2, log_every=3, save_every=9, ttt_steps=2, prefetch=ahead)
        )
        loop.fit(tr)
        head = loop.finish(tr)
        rows = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
        clock = {"tok_per_s", "train_seconds", "train_cpu_seconds", "rss_mib"}  # this process, not the recipe
        out[ahead] = (
            [{k: v for k, v in r.items() if k not in clock} for r in rows],
            load_file(head / "model.safetensors"),
            tr.loop.epoch,
        )
        assert set(readers) == {"eagle3-prefetch" if ahead else threading.main_thread().name}
    (m0, w0, e0), (m2, w2, e2) = out[0], out[2]
    assert e0 == e2 >= 1  # an epoch boundary was crossed
    assert m0 == m2
    assert w0.keys() == w2.keys() and all(torch.equal(w0[k], w2[k]) for k in w0)


# ---------------------------------------------------------------- 4. greedy losslessness under bf16/TF32
def _greedy_with_gaps(model, prompt, n):
    """Plain greedy tokens after `prompt`, each step's best and worst token and their logit gaps."""
    from eagle3cli.speculate.decoder import target_forward
    from eagle3cli.speculate.target import target_logits
    from eagle3cli.speculate.target_kv import TargetKV

    out, steps = [], []
    for _ in range(n):
        ctx = prompt + out
        logits = target_logits(
            model, target_forward(model, TargetKV(model, len(ctx) + 1), torch.tensor([ctx]), 0)[-1:]
        )[0]
        top = logits.topk(2)
        steps.append((int(top.indices[1]), float(top.values[0] - top.values[1]), int(logits.argmin())))
        out.append(int(top.indices[0]))
    return out, steps


def test_greedy_reference_says_which_comparison_and_counts_near_ties_apart(tiny, float32_matmul_precision):
    """The runner-up token where the target's top two are closest (gap well above fp32 rounding): a
    mismatch in fp32, a near tie under bf16 rounding ("medium" fp32 matmuls, imitating bf16/TF32 on a
    GPU); the target's worst token is a mismatch under both."""
    from eagle3cli.eval.losslessness import greedy_reference, near_tie

    model, _, _, prompt = tiny
    float32_matmul_precision("highest")
    exact = greedy_reference(model)
    assert exact["exact"] and exact["matmuls"] == "fp32" and exact["dtype"] == "float32" and exact["device"] == "cpu"
    plain, steps = _greedy_with_gaps(model, prompt, 12)
    at = min(range(len(steps)), key=lambda j: steps[j][1])
    runner_up, gap, worst = steps[at]
    ctx = prompt + plain[:at]
    assert gap > 1e-3 and near_tie(model, ctx, plain[at], runner_up, exact) is None  # fp32: a mismatch
    assert near_tie(model, ctx, plain[at], plain[at], exact)["logit_gap"] == 0.0  # an exact tie parts even in fp32
    float32_matmul_precision("medium")
    reduced = greedy_reference(model)
    assert not reduced["exact"] and reduced["matmuls"] == "bf16" and "near tie" in reduced["definition"]
    tie = near_tie(model, ctx, plain[at], runner_up, reduced)
    assert tie is not None and tie["logit_gap"] <= tie["tolerance"] and tie["logit_gap"] == pytest.approx(gap, abs=0.05)
    assert near_tie(model, ctx, plain[at], worst, reduced) is None


def test_eval_report_names_its_greedy_reference(tiny_target_dir, tmp_path):
    """eval's report says, per decoder, what its greedy outputs were compared with."""
    import json

    from cli_helpers import eval_args
    from head_fixtures import make_head

    from eagle3cli.cli import main

    head = make_head(tiny_target_dir, tmp_path / "run" / "head")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "Name a fruit."}]}) + "\n")
    out = tmp_path / "eval"
    assert (
        main(
            eval_args(
                tiny_target_dir,
                head,
                out,
                "--bench",
                str(prompts),
                "--num-prompts",
                "1",
                "--max-new-tokens",
                "6",
                "--depth",
                "2",
            )
        )
        == 0
    )
    ll = json.loads((out / "report.json").read_text())["heads"]
    (modes,) = ll.values()
    ref = modes["chain"]["lossless"]["reference"]
    assert ref["exact"] and ref["matmuls"] == "fp32" and ref["reference"].startswith("plain decoding, same target")
    assert modes["chain"]["lossless"]["near_ties"] == 0


# ---------------------------------------------------------------- on a real GPU (skipped without CUDA)
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_sampled_and_greedy_decoding_on_cuda(tiny_target_dir, dtype):
    """Sampling (plain, chain, tree, the sampling check) runs on the GPU, and greedy speculative
    output equals plain decoding's but for near ties in the reference's precision."""
    from eagle3cli.eval.losslessness import greedy_reference, near_tie, sampling_check

    model, tok, _ = load_target(tiny_target_dir, device="cuda", dtype=dtype)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Count to five."}], add_generation_prompt=True, tokenize=True
    )
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    draft = (
        Eagle3Draft(draft_config_from_target(model.config, model.config.vocab_size, aux)).to("cuda", model.dtype).eval()
    )
    for mode in ("chain", "tree"):
        dec = SpeculativeDecoder(model, draft, aux, mode=mode, depth=3, topk=2, num_draft_tokens=4, temperature=0.8)
        assert len(dec.generate(prompt, 12, seed=0).tokens) == 12
    assert sampling_check(model, dec, prompt, set(), draws=20, positions=3, temperature=0.8, top_p=1.0)["draws"] == 20
    ref, plain = greedy_reference(model), plain_decode(model, prompt, 16, set()).tokens
    for mode in ("chain", "tree"):
        spec = (
            SpeculativeDecoder(model, draft, aux, mode=mode, depth=3, topk=2, num_draft_tokens=4)
            .generate(prompt, 16)
            .tokens
        )
        if spec != plain:
            at = next(j for j, (a, b) in enumerate(zip(spec, plain)) if a != b)
            assert near_tie(model, prompt + plain[:at], plain[at], spec[at], ref) is not None, (mode, at)


@pytest.mark.gpu
def test_export_self_check_passes_under_tf32_on_cuda(tmp_path, tiny, float32_matmul_precision):
    """The trained head on the GPU, TF32 on: the reload runs on the same GPU and stays in its bound."""
    from eagle3cli.head.write import save_head, self_check

    model, draft, _, _ = tiny
    torch.backends.cuda.matmul.allow_tf32 = True
    cuda_draft = Eagle3Draft(draft.config).to("cuda")
    cuda_draft.load_state_dict(draft.state_dict())
    save_head(cuda_draft.cpu(), tmp_path / "head", {}, {})
    cuda_draft.to("cuda")
    diff, bound = self_check(cuda_draft, tmp_path / "head")
    assert diff <= bound


def test_a_budget_recorded_before_time_clock_reads_as_cpu_seconds(tmp_path):
    """Checkpoints written before --time-clock counted CPU seconds: they resume as `cpu` (the CPU
    benchmarks pass --time-clock cpu), and a new run's default is wall."""
    from eagle3cli.config import build_config, config_dict
    from eagle3cli.train.config import TrainConfig
    from eagle3cli.train.setup import config_key

    new = build_config(TrainConfig, None, "train", run=tmp_path / "run", time_budget_s=100.0)
    old = {k: v for k, v in config_dict(new).items() if k != "time_clock"}
    assert config_key(new)["time_clock"] == "wall"
    assert config_key(old)["time_clock"] == "cpu"
