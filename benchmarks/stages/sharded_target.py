"""A target bigger than one process: `eagle3 cache` and `eagle3 train --online` with the target split
over 2 ranks (`--tensor-parallel-size 2`), each rank under a memory cap below the whole model's bytes.

    .venv/bin/python benchmarks/stages/sharded_target.py --work runs/bench/sharded-target \
        --out runs/bench/sharded-target.json

Steps (each one's log in --work): build a random-weight fp32 Llama of ~1.2B parameters (heads and KV
heads divisible by 2; the tiny target's tokenizer and chat template) and a gen-data folder for it;
(1) the cache with 2 ranks, each capped; (2) the fp32 states (aux, final, logits) of the cached samples
from the whole model, uncapped, against the same from 2 capped ranks; (3) the whole model under the
same cap (it must fail to load: the cap is real); (4) a few steps of `train --online` with 2 capped
ranks. The cap is RLIMIT_DATA (`prlimit --data`): this machine's cgroup v2 has no memory controller,
and RLIMIT_AS also counts the address space torch reserves and never touches. RLIMIT_DATA bounds a
process's private writable memory, which is where a loaded model's weights live (and what a
copy-on-write map of a whole checkpoint is charged to: the ranks read their slices with pread). Peak memory per rank
is read from /proc while it runs (PSS from smaps_rollup, sampled; VmHWM, the kernel's peak RSS).

Prints one JSON object (docs/results-smollm2.json's `sharded_target`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.common import print_result  # noqa: E402

TOKENIZER = REPO / "models" / "tiny-target"
# ~1.18B parameters: 48 layers of 1536 wide (24 heads, 4 KV heads), MLP 4096, the tiny target's vocab.
# Deep and narrow, so the draft head (one layer of this width) stays small beside the target.
SHAPE = {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 24,
         "num_key_value_heads": 4, "max_position_embeddings": 2048}  # fmt: skip


def build_model(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **SHAPE,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).float()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (TOKENIZER / f).exists():
            shutil.copy(TOKENIZER / f, out / f)


def write_data(folder: Path, model: Path, n: int) -> None:
    """A gen-data folder of `n` GSM8K conversations (their original answers) made for `model`."""
    from eagle3cli.model.target import load_tokenizer, target_identity
    from eagle3cli.readers.sources import bundled
    from eagle3cli.run_folder.manifest import shard_record, write_manifest

    folder.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in bundled("gsm8k_train.jsonl").read_text().splitlines()[:n]]
    records = [
        {"id": f"gsm8k-{i}", "source": "gsm8k", "meta": {},
         "messages": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]}
        for i, r in enumerate(rows)
    ]  # fmt: skip
    shard = folder / "shard-00000.jsonl"
    shard.write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "rejects.jsonl").write_text("")
    ident = target_identity(model, load_tokenizer(model)).as_dict()
    write_manifest(
        folder, "gen-data", target=ident, config={}, counts={"records": n},
        shards=[shard_record(shard, records=n)], regenerated=False,
    )  # fmt: skip


def states(model: Path, cache: Path, samples: int, out: Path, tensor_parallel: int) -> None:
    """The fp32 aux rows, final rows and teacher logits of the cache's first samples, as the cache computes
    them (`ModelFeatures`); rank 0 writes them."""
    import torch
    from safetensors.torch import save_file

    from eagle3cli.cache import CacheReader
    from eagle3cli.cache.features import ModelFeatures
    from eagle3cli.model.sharded import read_slices_only
    from eagle3cli.model.target import open_target

    torch.set_num_threads(1)
    reader = CacheReader(cache)
    seqs = [reader[i]["input_ids"].numpy() for i in range(min(samples, len(reader)))]
    # the whole model read as the split one is (pread, no copy-on-write map of the checkpoint): under the
    # cap it then fails for want of room for its weights, not for a mapping
    with read_slices_only():
        target = open_target(model, load=True, device="cpu", dtype="fp32", tensor_parallel=tensor_parallel)
    f = ModelFeatures(target.model, tuple(reader.aux_layer_ids), 0)
    with torch.no_grad():
        aux, last = f.rows(seqs)
        logits = f.logits(last)
    if os.environ.get("RANK", "0") == "0":
        save_file({"aux": aux.contiguous(), "last": last.contiguous(), "logits": logits.contiguous()}, str(out))


class Peaks:
    """Per rank (the RANK in its environment), the largest PSS and VmHWM seen while a command runs."""

    def __init__(self, root: int):
        self.root, self.pss, self.hwm, self.stop = root, {}, {}, threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def descendants(self) -> list[int]:
        parents = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
        found, frontier = [self.root], [self.root]
        while frontier:
            p = frontier.pop()
            kids = [c for c, pp in parents.items() if pp == p]
            found += kids
            frontier += kids
        return found

    def watch(self) -> None:
        while not self.stop.is_set():
            for pid in self.descendants():
                try:
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    rank = next((e[5:].decode() for e in env if e.startswith(b"RANK=")), "launcher")
                    pss = next(int(x.split()[1]) for x in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                               if x.startswith("Pss:")) * 1024  # fmt: skip
                    hwm = next(int(x.split()[1]) for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                               if x.startswith("VmHWM:")) * 1024  # fmt: skip
                except (OSError, StopIteration, ValueError):
                    continue
                self.pss[rank] = max(self.pss.get(rank, 0), pss)
                self.hwm[rank] = max(self.hwm.get(rank, 0), hwm)
            time.sleep(0.1)

    def done(self) -> dict:
        self.stop.set()
        self.thread.join()
        ranks = sorted(r for r in self.pss if r != "launcher")
        return {
            "peak_pss_bytes": {r: self.pss[r] for r in ranks},
            "peak_rss_bytes": {r: self.hwm[r] for r in ranks},
            "launcher_peak_rss_bytes": self.hwm.get("launcher"),  # the processes that start the ranks
        }


def run(argv: list[str], log: Path, cap: int | None, keep: bool = False) -> tuple[int, dict, float]:
    """(exit code, peaks per rank, seconds) of `argv` (under `prlimit --data=cap` when capped); with
    `keep`, what an earlier run of the same step recorded beside its log."""
    record = log.with_suffix(".json")
    if keep and record.exists():
        got = json.loads(record.read_text())
        if got["argv"] == argv and got["cap"] == cap and got["code"] == 0:
            return got["code"], got["peaks"], got["seconds"]
    code, peaks, seconds = _run(argv, log, cap)
    record.write_text(json.dumps({"argv": argv, "cap": cap, "code": code, "peaks": peaks, "seconds": seconds}))
    return code, peaks, seconds


def _run(argv: list[str], log: Path, cap: int | None) -> tuple[int, dict, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO))
    cmd = (["prlimit", f"--data={cap}"] if cap else []) + argv
    t0 = time.time()
    with log.open("w") as out:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        peaks = Peaks(p.pid)
        code = p.wait()
    return code, peaks.done(), round(time.time() - t0, 1)


def rel_err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("runs/bench/sharded-target"))
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--cap", type=int, default=4_500_000_000, help="RLIMIT_DATA of each rank, bytes")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--states-samples", type=int, default=4)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="reuse the steps an earlier run finished in --work")
    ap.add_argument("--mode", choices=["all", "states"], default="all", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--states-out", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode == "states":
        return states(args.model, args.cache, args.states_samples, args.states_out, args.tp)
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from eagle3cli.cache import CacheReader

    work, py = args.work, sys.executable
    model, data = work / "model", work / "data"
    work.mkdir(parents=True, exist_ok=True)
    if not (model / "config.json").exists():
        subprocess.run([py, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); "
                        f"from benchmarks.stages.sharded_target import build_model; from pathlib import Path; "
                        f"build_model(Path({str(model)!r}))"], cwd=REPO, check=True)  # fmt: skip
    if not (args.keep and (data / "manifest.json").exists()):
        shutil.rmtree(data, ignore_errors=True)
        write_data(data, model, args.conversations)
    files = sorted(model.glob("*.safetensors"))
    model_bytes = sum(f.stat().st_size for f in files)
    params = 0
    for f in files:
        with safe_open(str(f), "pt") as st:
            params += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    assert args.cap < model_bytes, f"--cap {args.cap} must be below the model's {model_bytes} bytes"
    eagle3 = [py, "-m", "eagle3cli"]
    common = ["--target", str(model), "--max-length", str(args.max_length), "--dtype", "fp32"]

    # (1) the cache, 2 ranks, each capped
    cache = work / "cache"
    if not args.keep:
        shutil.rmtree(cache, ignore_errors=True)
    cache_cmd = [*eagle3, "cache", "--data", str(data), "--out", str(cache), *common, "--tensor-parallel-size", "2"]
    code, cache_peaks, cache_s = run(cache_cmd, work / "cache.log", args.cap, args.keep)
    assert code == 0, f"the capped 2-rank cache failed (exit {code}): {work / 'cache.log'}"
    manifest = json.loads((cache / "manifest.json").read_text())

    # (2) fp32 states: the whole model uncapped, then 2 capped ranks
    def states_cmd(tp: int, out: Path) -> list[str]:
        mode = [__file__, "--mode", "states", "--model", str(model), "--cache", str(cache), "--states-out", str(out),
                "--states-samples", str(args.states_samples), "--tp", str(tp)]  # fmt: skip
        return (
            [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *mode]
            if tp > 1
            else [py, *mode]
        )

    whole_s, split_s = work / "states-whole.safetensors", work / "states-split.safetensors"
    code, whole_peaks, _ = run(states_cmd(1, whole_s), work / "states-whole.log", None, args.keep)
    assert code == 0, f"the whole model's states failed: {work / 'states-whole.log'}"
    code, split_peaks, _ = run(states_cmd(2, split_s), work / "states-split.log", args.cap, args.keep)
    assert code == 0, f"the capped 2-rank states failed: {work / 'states-split.log'}"
    a, b = load_file(str(split_s)), load_file(str(whole_s))
    errors = {k: rel_err(a[k], b[k]) for k in ("aux", "last", "logits")}
    # the cache's stored (bf16) states against the whole model's fp32 ones
    reader = CacheReader(cache)
    stored = {
        k: torch.cat([reader[i][f"{k}_hidden"].float() for i in range(args.states_samples)]) for k in ("aux", "last")
    }
    stored_err = {k: rel_err(stored[k], b[k]) for k in stored}

    # (3) the whole model under the same cap: refused by the kernel, or the cap would prove nothing
    code, _, _ = run(states_cmd(1, work / "states-capped.safetensors"), work / "whole-capped.log", args.cap)
    whole_log = (work / "whole-capped.log").read_text()
    why = [ln.strip() for ln in whole_log.splitlines() if "memory allocation" in ln or "Error" in ln]
    capped_whole = f"failed (exit {code}) reading its weights: {why[-1] if why else 'see the log'}"
    assert code != 0, "the whole model loaded under the cap: the cap is too high to prove anything"

    # (4) train --online, 2 capped ranks
    run_dir = work / "train-run"
    # ZeRO-2 with 5M-element buckets (the preset's 50M are 200 MB buffers each, sized for GPUs)
    ds_config = work / "zero2-small-buckets.json"
    preset = json.loads((REPO / "eagle3cli" / "train" / "presets" / "zero2.json").read_text())
    preset["zero_optimization"].update(reduce_bucket_size=5_000_000, allgather_bucket_size=5_000_000)
    ds_config.write_text(json.dumps(preset, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    train_cmd = [*eagle3, "train", "--run", str(run_dir), "--online", "--data", str(data), *common[:4],
                 "--deepspeed", str(ds_config), "--nproc", "2", "--tensor-parallel-size", "2",
                 "--max-steps", str(args.train_steps), "--ttt-steps", "3", "--token-budget", "256",
                 "--heldout-samples", "2",
                 "--log-every", "1", "--save-every", str(args.train_steps)]  # fmt: skip
    code, train_peaks, train_s = run(train_cmd, work / "train.log", args.cap, args.keep)
    assert code == 0, f"the capped 2-rank train --online failed (exit {code}): {work / 'train.log'}"
    steps = [
        json.loads(line) for line in (run_dir / "train" / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]

    every = [cache_peaks, split_peaks, train_peaks]
    peak = max(v for p in every for v in p["peak_pss_bytes"].values())
    result = {
        "ranks": 2,
        "model": f"random-weight Llama, {params / 1e9:.2f}B parameters, fp32 "
        f"({SHAPE['num_hidden_layers']} layers x {SHAPE['hidden_size']}, {SHAPE['num_attention_heads']} heads, "
        f"{SHAPE['num_key_value_heads']} KV heads)",
        "params": params,
        "model_bytes": model_bytes,
        "rank_cap_bytes": args.cap,
        "cap": "RLIMIT_DATA per process (prlimit --data), the private writable memory a loaded model lives in: "
        "cgroup v2 here has no memory controller, and RLIMIT_AS would count address space torch reserves but "
        "never touches",
        "peak_rank_bytes": peak,
        "peak_by_stage": {"cache": cache_peaks, "states": split_peaks, "train_online": train_peaks},
        "whole_model_uncapped_peak_rss_bytes": whole_peaks["launcher_peak_rss_bytes"],  # one process, no RANK
        "whole_model_under_cap": capped_whole,
        "max_rel_err": max(errors.values()),
        "max_rel_err_by_tensor": errors,
        "states_samples": args.states_samples,
        "stored_bf16_vs_whole_fp32": stored_err,
        "cache_samples": manifest["counts"]["samples"],
        "cache_tokens": manifest["counts"]["tokens"],
        "cache_tokens_per_s": manifest["throughput"]["tokens_per_s"],
        "cache_wall_s": cache_s,
        "train_steps": max(s.get("step", 0) for s in steps),
        "train_wall_s": train_s,
        "device": "CPU, 2 ranks (gloo), OMP_NUM_THREADS=1, on a 2-core machine shared with a training job",
        "commands": [
            " ".join(c)
            .replace(py, ".venv/bin/python")
            .replace(".venv/bin/python -m eagle3cli", "eagle3")
            .replace(str(REPO) + "/", "")
            for c in (cache_cmd, train_cmd)
        ],  # fmt: skip
        "measured_at": time.strftime("%Y-%m-%d"),
    }
    print_result(result, args.out)


if __name__ == "__main__":
    main()
