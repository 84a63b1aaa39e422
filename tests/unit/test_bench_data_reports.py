"""The data round's report keys and llama.cpp's round-cost breakdown: read from what stages and engines
wrote (a corpus folder mid-regeneration, a llama-server log, llama-bench's JSON), never assumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.llama_cpp.round_cost import breakdown, spec_stats, table
from benchmarks.smollm2.report import corpus_json
from benchmarks.smollm2.report_page import page


def _record(i: int, tokens: list[int]) -> dict:
    return {
        "id": f"src:{i}",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "meta": {"turns": [{"completion_tokens": t, "prompt_tokens": 5} for t in tokens]},
    }


def test_corpus_counts_finished_shards_and_the_journal_of_the_shard_in_progress(tmp_path):
    (tmp_path / "shard-00000.jsonl").write_text("".join(json.dumps(_record(i, [10, 20])) + "\n" for i in range(3)))
    prog = tmp_path / "progress"
    (prog / "sessions").mkdir(parents=True)
    # shard 0 is finished: its journal (left by a kill before cleanup) must not count twice
    (prog / "shard-00000.journal.jsonl").write_text(json.dumps({"plan_index": 0, "record": _record(0, [10])}) + "\n")
    (prog / "shard-00001.journal.jsonl").write_text(
        json.dumps({"plan_index": 3, "record": _record(3, [7])})
        + "\n"
        + json.dumps({"plan_index": 4, "reject": {"reason": "x"}})
        + "\n"
    )
    (prog / "state.json").write_text(json.dumps({"planned": 10, "engine": {"engine": "vllm", "version": "v1"}}))
    (prog / "sessions" / "a.json").write_text(json.dumps({"seconds": 10, "conversations": 2, "completion_tokens": 50}))
    (prog / "sessions" / "b.json").write_text(json.dumps({"seconds": 30, "conversations": 2, "completion_tokens": 57}))
    c = corpus_json(tmp_path)
    assert c["conversations"] == 4 and c["assistant_turns"] == 7
    assert c["completion_tokens"] == 3 * 30 + 7
    assert c["planned"] == 10 and c["complete"] is False
    assert c["backend"] == "openai -> vllm v1"
    assert c["gen_tok_s"] == pytest.approx(107 / 40, abs=0.05) and c["sessions"] == 2


def test_a_finished_corpus_reports_the_rate_its_manifest_kept(tmp_path):
    # gen-data clears progress/ when it writes the manifest: the sessions' rate lives on in the manifest
    (tmp_path / "shard-00000.jsonl").write_text("".join(json.dumps(_record(i, [10])) + "\n" for i in range(2)))
    rate = {"sessions": 3, "seconds": 100.0, "process_seconds": 180.0, "conversations": 2, "completion_tokens": 20,
            "conversations_per_s": 0.02, "completion_tok_s": 0.2}  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps({"counts": {"planned": 2}, "throughput": rate,
                                                        "engine": {"engine": "vllm", "version": "v1"}}))  # fmt: skip
    c = corpus_json(tmp_path)
    assert c["complete"] is True and c["planned"] == 2 and c["conversations"] == 2
    assert c["gen_tok_s"] == 0.2 and c["generation_seconds"] == 100.0 and c["process_seconds"] == 180.0


def test_a_corpus_of_several_source_folders_reports_their_sums_and_each_source(tmp_path):
    from benchmarks.smollm2.report import corpus_sources_json

    for name, n, toks, secs in (("sharegpt", 3, 10, 100.0), ("gsm8k", 2, 4, 20.0)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "shard-00000.jsonl").write_text("".join(json.dumps(_record(i, [toks])) + "\n" for i in range(n)))
        rate = {"sessions": 1, "seconds": secs, "process_seconds": 2 * secs, "conversations": n,
                "completion_tokens": n * toks, "conversations_per_s": n / secs, "completion_tok_s": n * toks / secs}  # fmt: skip
        (folder / "manifest.json").write_text(json.dumps({"counts": {"planned": n}, "throughput": rate,
                                                          "engine": {"engine": "vllm", "version": "v1"}}))  # fmt: skip
    one = corpus_sources_json([tmp_path / "sharegpt"])
    assert "sources" not in one and one["conversations"] == 3
    c = corpus_sources_json([tmp_path / "sharegpt", tmp_path / "gsm8k"])
    assert c["conversations"] == 5 and c["planned"] == 5 and c["completion_tokens"] == 38 and c["complete"] is True
    assert c["gen_tok_s"] == pytest.approx(38 / 120, abs=0.05) and c["backend"] == "openai -> vllm v1"
    assert [s["conversations"] for s in c["sources"]] == [3, 2]
    text = page({"corpus": c})
    assert "2 sources" in text and "5 of 5 conversations" in text and text.count("complete:") == 2


def test_side_by_side_shard_processes_count_their_clock_time_once(tmp_path):
    # two `--shard i/2` processes worked 0-100 s and 50-150 s (150 s of clock, 200 process-seconds);
    # a session of an older eagle3 (no interval) adds its own 40 s
    from eagle3cli.data.finish import throughput

    sessions = tmp_path / "progress" / "sessions"
    sessions.mkdir(parents=True)
    for name, d in {
        "a": {"seconds": 100, "start": 1000.0, "end": 1100.0, "conversations": 30, "completion_tokens": 3000},
        "b": {"seconds": 100, "start": 1050.0, "end": 1150.0, "conversations": 30, "completion_tokens": 3000},
        "c": {"seconds": 40, "conversations": 10, "completion_tokens": 1900},
        "d": {"seconds": 5, "start": 1200.0, "end": 1205.0, "conversations": 1, "completion_tokens": 100},
    }.items():
        (sessions / f"{name}.json").write_text(json.dumps(d))
    t = throughput(tmp_path, 0.0, 0, 0)
    assert t["seconds"] == 150 + 40 + 5 and t["process_seconds"] == 245
    assert t["completion_tok_s"] == pytest.approx(8000 / 195, abs=0.05)
    assert t["conversations_per_s"] == pytest.approx(71 / 195, abs=0.001)


def test_the_throughput_section_carries_every_ratio_the_issue_asks_for():
    rows = [{"concurrency": 32, "prompts": 128, "gen_data_tok_s": 90.0, "engine_tok_s": 100.0, "hf_tok_s": 5.0,
             "gen_data_vs_engine": 0.9, "gen_data_vs_hf": 18.0}]  # fmt: skip
    corpus = {"folder": "c", "complete": True, "planned": 1, "backend": "openai", "generation_seconds": 1.0}
    corpus |= dict.fromkeys(("conversations", "assistant_turns", "completion_tokens", "gen_tok_s", "sessions"), 1)
    corpus["conversations_per_s"] = 1.0
    text = page({"corpus": corpus, "gen_data_throughput": rows, "gen_data_throughput_settings": {"target": "t"}})
    assert "| 32 | 128 | 90.0 | 100.0 | 0.90x | 5.0 | 18.0x |" in text


STATS_LINE = (
    "spec print_stats: statistics     draft-eagle3: #calls(b,g,a) =   10    200    198, #gen drafts =    200, "
    "#acc drafts =   90, #gen tokens =    600, #acc tokens =   150, #mean acc len = 1.76, #acc rate/pos = (0.4), "
    "dur(b,g,a) = 1.500, 3000.000, 4.250 ms"
)


def test_the_last_statistics_line_of_a_server_log_is_read(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "srv  load_model: ...\n" + STATS_LINE.replace("3000.000", "10.000") + "\nnoise\n" + STATS_LINE + "\n"
    )
    s = spec_stats(log)
    assert s == {
        "implementation": "draft-eagle3",
        "calls_begin": 10,
        "calls_draft": 200,
        "calls_accept": 198,
        "begin_ms": 1.5,
        "draft_ms": 3000.0,
        "accept_ms": 4.25,
    }
    (tmp_path / "quiet.log").write_text("srv  no statistics at this verbosity\n")
    assert spec_stats(tmp_path / "quiet.log") is None


def test_a_round_is_split_into_draft_verification_and_the_rest_in_plain_steps():
    stats = {"calls_draft": 200, "draft_ms": 3000.0}
    # 1000 tokens decoded at 50 tok/s = 20 s over 200 rounds: 100 ms a round; plain 100 tok/s = 10 ms a step
    row = {"k": 3, "tau": 1.6, "tokens": 1000, "verify_steps": 200, "decode_tok_s": 50.0, "plain_decode_tok_s": 100.0}
    b = breakdown(row, stats, {"pass_ms": {4: 12.0}, "tg_ms_per_token": 9.0})
    assert b["ms"] == {"round": 100.0, "draft": 15.0, "verify": 12.0, "overhead": 73.0, "plain_step": 10.0}
    assert b["plain_steps"] == {"round": 10.0, "draft": 1.5, "verify": 1.2, "overhead": 7.3}
    assert b["draft_per_token_plain_steps"] == 0.5 and b["break_even_tau"] == 10.0
    assert "| 3 | 1.600 | 10.00 | 1.50 | 1.20 | 7.30 | 0.50 | 10.00 |" in table([b])
    # no statistics (verbosity too low) or no pass of k+1 tokens measured: no row, not a guess
    assert breakdown(row, None, {"pass_ms": {4: 12.0}, "tg_ms_per_token": 9.0}) is None
    assert breakdown(row, stats, {"pass_ms": {2: 12.0}, "tg_ms_per_token": 9.0}) is None


def test_report_with_a_missing_input_exits_2_and_writes_nothing(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    md = tmp_path / "results.md"
    r = subprocess.run(
        [sys.executable, str(repo / "benchmarks/smollm2/report.py"), "--vllm-cpu", str(tmp_path / "nope.json"),
         "--results-md", str(md)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "nope.json does not exist" in r.stderr and "nothing was written" in r.stderr, r.stderr
    assert not md.exists() and not md.with_suffix(".json").exists()


def test_the_decoders_round_is_split_like_llama_cpps_and_set_beside_it():
    from benchmarks.llama_cpp.round_cost import decoder_rounds, side_by_side

    phases = {"draft_forward": 0.1, "draft_logits_pick": 0.05, "verify_forward": 1.0, "target_logits": 0.2,
              "accept": 0.01, "commit": 0.04, "glue": 0.05, "total": 1.45}  # fmt: skip
    report = {
        "profile": {"trained": {"fp32": {"chain3": phases, "chain1": {**phases, "total": 1.3}, "tree8_16": phases}}},
        "rounds": {"trained": {"fp32": {"chain3": {"tau": 1.6, "speedup_vs_plain": 1.1}, "chain1": {"tau": 1.4}}}},
    }
    rows = decoder_rounds(report)
    assert [r["k"] for r in rows] == [1, 3]  # chains only, in order of k
    r3 = rows[1]
    assert r3["plain_steps"] == {"round": 1.45, "draft": 0.15, "verify": 1.2, "overhead": 0.1}
    assert r3["tau"] == 1.6 and r3["draft_per_token_plain_steps"] == 0.05 and r3["break_even_tau"] == 1.45
    llama = [{"k": 3, "tau": 1.5, "plain_steps": {"round": 1.6, "draft": 0.2, "verify": 0.7, "overhead": 0.7},
              "break_even_tau": 1.6}]  # fmt: skip
    text = side_by_side(llama, rows)
    assert (
        "| 3 | llama.cpp | 1.500 | 1.60 |" in text
        and "| 3 | eagle3 decoder | 1.600 | 1.45 | 0.15 | 1.20 | 0.10 |" in text
    )
    assert decoder_rounds({}) == []


def test_page_figures_are_drawn_from_its_json_and_linked_under_their_sections(tmp_path):
    from benchmarks.smollm2.report_page import FIGURES, draw_figures, figure_line

    (LEARNING_CURVE, _), (SWEEP, _) = FIGURES["learning_curve"], FIGURES["sweep"]

    conf = {"chain d=1": {"tau": 1.3, "speedup": 1.1}, "chain d=2": {"tau": 1.5, "speedup": 0.9}}
    data = {
        "learning_curve": [
            {"tokens": 1000 * 2**i, "cpu_seconds": 60.0 * (i + 1), "heldout_tau": 1.2 + 0.1 * i} for i in range(4)
        ],
        "sweep": {
            "fp32": {"configurations": conf, "best": "chain d=1", "speedup_interval": [1.0, 1.2], "prompts": 8},
            "bf16": None,  # a dtype the sweep did not run is left out, not drawn empty
        },
    }
    assert draw_figures(data, tmp_path) == [LEARNING_CURVE, SWEEP]
    assert all((tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in (LEARNING_CURVE, SWEEP))
    assert draw_figures({"sweep": {"fp32": None}}, tmp_path / "none") == []  # no key, no figure
    for p in data["learning_curve"]:
        p["steps"] = 100
    curve = page({"learning_curve": data["learning_curve"]})
    assert f"## Learning curve of the published head\n\n{figure_line('learning_curve')}\n" in curve
    assert "eval --sweep" not in page({"sweep": {"fp32": None}})  # no sweep measured: no section


def test_data_scaling_refuses_a_corpus_still_being_made_with_exit_2(tmp_path, tiny_target_dir):
    # a gen-data folder without manifest.json (shards still being written): the reason, exit 2, nothing made
    import subprocess
    import sys

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "shard-00000.jsonl").write_text(json.dumps(_record(0, [5])) + "\n")
    out = tmp_path / "scaling"
    r = subprocess.run([sys.executable, "benchmarks/stages/data_scaling.py", "--data", str(corpus), "--target",
                        str(tiny_target_dir), "--epochs", "1", "--out", str(out)],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "has no manifest.json" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
    # a budget of no steps would have trained with --epochs None: refused before anything is read
    for budget in (["--steps-per-run", "0"], ["--tokens-per-run", "-5"], ["--epochs", "0"]):
        r = subprocess.run([sys.executable, "benchmarks/stages/data_scaling.py", "--data", str(corpus), "--target",
                            str(tiny_target_dir), *budget, "--out", str(out)],
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
        assert r.returncode == 2 and "expected a positive integer" in r.stderr and not out.exists(), r.stderr


def test_the_data_scaling_keys_section_and_figure_come_from_data_scalings_json(tmp_path):
    # report.py --data-scaling: rows and the tested fit in the JSON, a section stating both, the figure
    # drawn from those keys and linked under the section; a second report renders the same page
    import subprocess
    import sys

    from benchmarks.stages.data_scaling import analyse

    rows = [{"fraction": f"1/{2**k}", "conversations": 100 * 2 ** (4 - k), "tokens": 50_000 * 2 ** (4 - k),
             "trained_tokens": 50_000 * 2 ** (4 - k), "heldout_tau": 1.1 + 0.1 * (4 - k),
             "mt_bench_tau": 1.0 + 0.08 * (4 - k), "commands": ["train ...", "eval ..."]} for k in (4, 3, 2, 1)]  # fmt: skip
    corpus = {"samples": 3200, "tokens": 1_600_000, "heldout_samples": 32}
    fits = {k: analyse(rows, k, corpus["tokens"]) for k in ("heldout_tau", "mt_bench_tau")}
    bench = tmp_path / "data_scaling.json"
    bench.write_text(json.dumps({"data": "corpora/c", "online": True, "budget": {"epochs": 1}, "corpus": corpus,
                                 "rows": rows, "fits": fits}))  # fmt: skip
    md = tmp_path / "results.md"
    md.write_text("# R\n\n## Acceptance and speed by bench (depth 8)\n\nx\n")
    repo = Path(__file__).resolve().parents[2]
    cmd = [
        sys.executable,
        str(repo / "benchmarks/smollm2/report.py"),
        "--data-scaling",
        str(bench),
        "--results-md",
        str(md),
    ]
    for _ in range(2):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    data = json.loads(md.with_suffix(".json").read_text())
    assert [x["tokens"] for x in data["data_scaling"]] == [x["tokens"] for x in rows]
    assert data["data_scaling"][0]["commands"] == ["train ...", "eval ..."]  # what --reuse matches
    fit = data["data_scaling_fit"]
    assert fit["tau"] == "mt_bench_tau" and fit["measured_full"] == pytest.approx(1.24)
    assert fit["predicted_full"] == pytest.approx(1.24) and fit["predicted_corpus"] == pytest.approx(
        1.40
    )  # two doublings past 400k
    assert fit["heldout"]["measured_full"] == pytest.approx(1.4)
    assert data["data_scaling_settings"]["corpus"] == corpus
    text = md.read_text()
    assert text.count("## Data scaling") == 1 and "## Acceptance" not in text  # rendered from the JSON alone
    assert "predicted **1.240** for the largest size" in text and "MT-bench tau **1.400**" in text
    assert "![" in text.split("## Data scaling")[1].split("\n\n")[1]  # the figure, first under its heading
    assert (tmp_path / "results-data-scaling.png").read_bytes()[:4] == b"\x89PNG"
    # a later report of another key rewrites the data sections too: the figure stays linked, once
    vllm = _vllm_results(tmp_path / "vllm.json")
    r = subprocess.run([*cmd[:2], "--vllm-cpu", str(vllm), "--results-md", str(md)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert md.read_text().count("(results-data-scaling.png)") == 1


def _equal_compute_json(path: Path, data: str, sizes: tuple[int, ...], tau, steps: int = 1380) -> Path:
    train = f"eagle3 train --run runs/x --online --data {data} --train-samples N --recipe r.yaml --max-steps {steps}"
    ev = "eagle3 eval --run runs/x --bench mt_bench --num-prompts 80"
    rows = [{"fraction": f"1/{2**k}", "conversations": 100 * 2 ** (4 - k), "tokens": 50_000 * 2 ** (4 - k),
             "trained_tokens": 800_000, "heldout_tau": 1.5, "mt_bench_tau": tau(k),
             "commands": [train.replace("N", str(100 * 2 ** (4 - k))), ev]} for k in sizes]  # fmt: skip
    from benchmarks.stages.data_scaling import analyse

    fits = {"mt_bench_tau": analyse(rows, "mt_bench_tau")} if len(rows) >= 3 else {}
    path.write_text(json.dumps({"data": data, "online": True, "budget": {"steps_per_run": steps, "token_budget": 1024},
                                "corpus": {"samples": 3200, "tokens": 1_600_000, "heldout_samples": 32},
                                "rows": rows, "fits": fits}))  # fmt: skip
    return path


def test_the_equal_compute_curve_and_other_corpora_at_its_budget_join_the_scaling_section(tmp_path):
    import subprocess
    import sys

    from benchmarks.stages.data_scaling import analyse

    one = [{"fraction": f"1/{2**k}", "conversations": 100 * 2 ** (4 - k), "tokens": 50_000 * 2 ** (4 - k),
            "trained_tokens": 50_000 * 2 ** (4 - k), "heldout_tau": 1.2, "mt_bench_tau": 1.0 + 0.2 * (4 - k),
            "commands": ["t", "e"]} for k in (4, 3, 2, 1)]  # fmt: skip
    first = tmp_path / "one.json"
    first.write_text(json.dumps({"data": "corpora/c", "online": True, "budget": {"epochs": 1},
                                 "corpus": {"samples": 3200, "tokens": 1_600_000, "heldout_samples": 32},
                                 "rows": one, "fits": {"mt_bench_tau": analyse(one, "mt_bench_tau")}}))  # fmt: skip
    # the sizes in the order a curve resumed them (--fractions 1/4,1/16,1/8,1/2): the table sorts them by size
    eq = _equal_compute_json(tmp_path / "eq.json", "corpora/c", (2, 4, 3, 1), lambda k: 1.4 + 0.05 * (4 - k))
    curve = json.loads(eq.read_text())
    curve["rows"][-1]["same_run_as"] = "eagle3 train ... --epochs 1"  # data_scaling.py --reuse's mark
    repo = Path(__file__).resolve().parents[2]  # a curve run from another checkout with --out into this one
    curve["rows"][0]["commands"][0] = curve["rows"][0]["commands"][0].replace("runs/x", f"{repo}/runs/eq/n1")
    eq.write_text(json.dumps(curve))
    synth = _equal_compute_json(tmp_path / "syn.json", "corpora/synth", (1,), lambda k: 1.7)
    md = tmp_path / "results.md"
    md.write_text("# R\n\n## Acceptance and speed by bench (depth 8)\n\nx\n")
    report = [sys.executable, str(Path(__file__).resolve().parents[2] / "benchmarks/smollm2/report.py")]
    r = subprocess.run([*report, "--data-scaling", str(first), "--data-scaling-equal-compute", str(eq), str(synth),
                        "--results-md", str(md)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(md.with_suffix(".json").read_text())
    assert [x["mt_bench_tau"] for x in data["data_scaling_equal_compute"]] == pytest.approx([1.5, 1.4, 1.45, 1.55])
    assert data["data_scaling_equal_compute"][0]["commands"][0].startswith("eagle3 train --run runs/eq/n1 --online")
    settings = data["data_scaling_equal_compute_settings"]
    assert settings["budget"]["steps_per_run"] == 1380 and settings["points"][0]["data"] == "corpora/synth"
    text = md.read_text()
    # the slope at equal compute beside one epoch's; the other corpus against the curve's fit at its tokens (400k)
    assert "**+0.050 per doubling of distinct tokens**, against +0.200 at one epoch per size: 25% of" in text
    assert "`corpora/synth`" in text and "reads MT-bench **1.700**, where the curve's fit says 1.550 (+0.150)" in text
    # +0.150 at +0.050 per doubling: 2**3 times its 400k tokens (the fit's rounding in the last digits)
    assert "buys that tau with 3,20" in text and "one of this corpus's tokens is worth **8.00** of them" in text
    # measured beside measured, then the fit's exchange rate flagged where it reaches past the curve's sizes
    assert "The curve's size nearest in distinct tokens (1/2, 400,000) reads 1.550: +0.150." in text
    assert "(an extrapolation: 8x the curve's largest size, on a slope of +0.050 per doubling)." in text
    assert "| 1/16 | 50,000 | 800,000 | 16.0 | 1.500 | 1.400 | 1.000 |" in text
    assert "| 1/2 (the one-epoch run) | 400,000 |" in text
    table = [line.split(" |")[0] for line in text.splitlines() if line.startswith("| 1/") and "| 800,000 |" in line]
    assert table == ["| 1/16", "| 1/8", "| 1/4", "| 1/2 (the one-epoch run)"]  # fewest tokens first
    assert (tmp_path / "results-data-scaling.png").read_bytes()[:4] == b"\x89PNG"
    # a point at another budget, or a curve at one epoch per size, is refused and nothing is written
    before = md.with_suffix(".json").read_text()
    other = _equal_compute_json(tmp_path / "other.json", "corpora/synth", (1,), lambda k: 1.7, steps=999)
    for bad in ([str(eq), str(other)], [str(first)]):
        r = subprocess.run([*report, "--data-scaling-equal-compute", *bad, "--results-md", str(md)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 2 and "nothing was written" in r.stderr, r.stderr
    assert md.with_suffix(".json").read_text() == before


def _vllm_results(path: Path) -> Path:
    run = {"tok_s": 30.0, "plain_tok_s": 25.0, "tau": 1.5, "per_position": [0.5], "drafts": 10, "outputs_differ": 0}
    slow = {**run, "tok_s": 20.0, "tau": 1.7, "outputs_differ": 1}
    path.write_text(json.dumps({
        "target": "T", "head": "H", "bench": "mt_bench", "num_prompts": 4, "max_new_tokens": 8,
        "engine": {"fp32-k1": [run, {**run, "tok_s": 27.5}], "fp32-k3": [slow, slow]},
        "eval": {"fp32-k1": {"tau": 1.5}}, "commands": ["c"],
    }))  # fmt: skip
    return path


def test_vllm_engine_speedup_is_the_best_k_by_the_geometric_mean_of_its_runs(tmp_path):
    from benchmarks.smollm2.report import vllm_engine_json

    v = vllm_engine_json(_vllm_results(tmp_path / "r.json"))
    assert v["k"] == 1 and v["dtype"] == "fp32" and v["identical"] is True and v["tau"] == 1.5
    assert v["speedup_vs_plain"] == pytest.approx((1.2 * 1.1) ** 0.5, abs=1e-4)
    k3 = next(r for r in v["rows"] if r["k"] == 3)
    assert k3["identical"] is False and k3["eval_tau"] is None and k3["speedup_vs_plain"] == pytest.approx(0.8)
    assert v["rows"][0]["order"].startswith("blocks")  # a result from before eval interleaved the servers


def test_vllm_engine_rows_carry_each_runs_interval_and_the_order_into_the_page(tmp_path):
    from benchmarks.smollm2.report import vllm_engine_json

    r = json.loads(_vllm_results(tmp_path / "r.json").read_text())
    for i, run in enumerate(r["engine"]["fp32-k1"]):
        run.update(speedup_interval=[1.0 + i / 10, 1.3 + i / 10], order="interleaved: both back to back")
    (tmp_path / "r.json").write_text(json.dumps(r))
    v = vllm_engine_json(tmp_path / "r.json")
    assert v["rows"][0]["speedup_intervals"] == [pytest.approx([1.0, 1.3]), pytest.approx([1.1, 1.4])]
    text = page({"engine_speedup": {"vllm_cpu": v}})
    assert "same prompts, interleaved: both back to back;" in text
    assert "| 1 | fp32 | 1.500 | 1.500 | 1.15x (1.20 [1.00, 1.30] / 1.10 [1.10, 1.40]) | True |" in text
    assert "| 3 | fp32 | 1.700 | - | 0.80x (0.80 / 0.80) | False |" in text  # no eval of k=3: said, not guessed


@pytest.mark.parametrize("text", ["{not json", '{"engine": {}}', "[1, 2]"])
def test_report_vllm_cpu_refuses_a_file_that_is_not_a_bench_result_with_exit_2(tmp_path, text):
    import subprocess
    import sys

    bad = tmp_path / "results.json"
    bad.write_text(text)
    md = tmp_path / "page.md"
    md.write_text("# page\n")
    r = subprocess.run([sys.executable, "benchmarks/smollm2/report.py", "--vllm-cpu", str(bad), "--results-md", str(md)],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert r.returncode == 2 and "run_bench.py" in r.stderr and "nothing was written" in r.stderr
    assert md.read_text() == "# page\n" and not md.with_suffix(".json").exists()


def _lever_arm(
    root: Path, name: str, steps: int, per_prompt: list[tuple[int, int]], num_prompts: int = 4, carry: bool = False
) -> Path:
    """An arm folder as benchmarks/smollm2/levers.py leaves it: train manifest + three eval reports (four with
    the carry-over bench, HumanEval)."""
    run = root / name
    (run / "train").mkdir(parents=True)
    cfg = {"data": f"corpora/{name}", "loss": "ce", "max_steps": steps}
    (run / "train" / "manifest.json").write_text(json.dumps({"config": cfg, "tokens_seen": 1_000_000}))
    (run / "train" / "metrics.jsonl").write_text(json.dumps({"step": steps, "epoch": 0}) + "\n")
    rows = [{"prompt": i, "tokens": 10, "rounds": r, "accepted": a} for i, (a, r) in enumerate(per_prompt)]
    tau = sum(a + r for a, r in per_prompt) / sum(r for _, r in per_prompt)
    for bench in ("mt_bench", "gsm8k", "sharegpt", *(["humaneval"] if carry else [])):
        (run / f"eval-{bench}").mkdir()
        depths = [{"depth": 1, "attempts": 4, "accepted": 2, "alpha": 0.5}, {"depth": 2, "attempts": 0, "alpha": 0.0}]
        chain = {"acceptance": {"tau": tau, "tau_interval": [tau - 0.1, tau + 0.1], "per_depth": depths},
                 "per_prompt": rows,
                 "lossless": {"mismatches": 0}}  # fmt: skip
        report = {"bench": bench, "num_prompts": num_prompts, "max_new_tokens": 64, "depth": 8, "mode": "chain",
                  "temperature": 0.0, "heads": {f"{name}/head": {"chain": chain}}}  # fmt: skip
        (run / f"eval-{bench}" / "report.json").write_text(json.dumps(report))
    return run


def test_data_levers_rows_pair_each_arm_with_the_baseline_and_refuse_other_budgets(tmp_path):
    from benchmarks.smollm2.report_levers import levers_json

    base = _lever_arm(tmp_path, "baseline", 100, [(4, 4), (4, 4), (4, 4), (4, 4)])
    better = _lever_arm(tmp_path, "synthetic", 100, [(8, 4), (8, 4), (4, 4), (4, 4)])
    rows = levers_json({"baseline": base, "synthetic": better}, "baseline", start_tau=1.5)
    by = {r["arm"]: r for r in rows}
    assert by["baseline"]["mt_bench_tau"] == 2.0 and by["baseline"]["delta_vs_baseline"] == 0.0
    assert by["synthetic"]["mt_bench_tau"] == 2.5 and by["synthetic"]["delta_vs_baseline"] == 0.5
    lo, hi = by["synthetic"]["delta_interval"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0  # prompts resampled together: never below what no prompt gained
    assert by["synthetic"]["tau_gain_per_million_tokens"] == 1.0  # (2.5 - 1.5) over 1M tokens
    assert by["synthetic"]["data"] == "corpora/synthetic"
    # an arm over two folders (levers.py --extra-data) names both, inside the repository as relative paths
    from benchmarks.smollm2.report_levers import arm_row
    from benchmarks.smollm2.report_page import REPO

    manifest = better / "train" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["config"].update(data=str(REPO / "corpora/chitchat"), extra_data=["corpora/chitchat-rest"])
    manifest.write_text(json.dumps(m))
    assert arm_row("chitchat", better, None)["data"] == "corpora/chitchat + corpora/chitchat-rest"
    other = _lever_arm(tmp_path, "lk", 50, [(4, 4)] * 4)
    with pytest.raises(ValueError, match="different budgets"):
        levers_json({"baseline": base, "lk": other}, "baseline", start_tau=None)
    fewer = _lever_arm(tmp_path, "chitchat", 100, [(4, 4)] * 4, num_prompts=3)
    with pytest.raises(ValueError, match="eval differs"):
        levers_json({"baseline": base, "chitchat": fewer}, "baseline", start_tau=None)


def test_data_levers_pairs_a_new_arm_with_the_stored_baseline_when_its_run_folder_is_gone(tmp_path):
    import shutil

    from benchmarks.smollm2.report_levers import levers_json

    base = _lever_arm(tmp_path, "baseline", 100, [(4, 4), (4, 4), (4, 4), (4, 4)])
    stored = levers_json({"baseline": base}, "baseline", start_tau=None)
    shutil.rmtree(base)  # a later session: runs/ did not travel
    lk = _lever_arm(tmp_path, "lk", 100, [(8, 4), (4, 4), (4, 4), (4, 4)])
    rows = levers_json({"lk": lk}, "baseline", start_tau=None, stored=stored)
    assert [r["arm"] for r in rows] == ["baseline", "lk"]  # the page's order, the stored row kept
    assert rows[1]["delta_vs_baseline"] == 0.25 and rows[0]["mt_bench_per_prompt"]["rounds"] == [4, 4, 4, 4]
    other = _lever_arm(tmp_path, "synthetic", 50, [(4, 4)] * 4)
    with pytest.raises(ValueError, match="different budgets"):
        levers_json({"synthetic": other}, "baseline", start_tau=None, stored=stored)
    old = [{k: v for k, v in stored[0].items() if k != "mt_bench_per_prompt"}]
    with pytest.raises(KeyError, match="predates per-prompt counts"):
        levers_json({"lk": lk}, "baseline", start_tau=None, stored=old)
    with pytest.raises(KeyError, match="no run folder and no stored row"):
        levers_json({"augment": None}, "baseline", start_tau=None, stored=stored)


def test_data_levers_carry_over_column_pairs_humaneval_only_where_both_sides_measured_it(tmp_path):
    from benchmarks.smollm2.report_levers import levers_json

    def section(rows, start_tau, figure):
        from benchmarks.smollm2.report_page import page as render_page

        return render_page({"data_levers": rows}).splitlines()

    base = _lever_arm(tmp_path, "baseline", 100, [(4, 4)] * 4, carry=True)
    synth = _lever_arm(tmp_path, "synthetic", 100, [(8, 4), (8, 4), (4, 4), (4, 4)], carry=True)
    lk = _lever_arm(tmp_path, "lk", 100, [(4, 4)] * 4)  # measured before the carry-over eval existed
    rows = {r["arm"]: r for r in levers_json({"baseline": base, "synthetic": synth, "lk": lk}, "baseline", None)}
    assert rows["synthetic"]["humaneval_tau"] == 2.5 and rows["synthetic"]["humaneval_delta"] == 0.5
    assert "humaneval_tau" not in rows["lk"] and "humaneval_delta" not in rows["lk"]
    page = "\n".join(section(list(rows.values()), None, "f.png"))
    assert "| 2.500 (+0.500 [" in page
    assert "(2 epochs: repeated)" not in page
    (lk / "train" / "metrics.jsonl").write_text('{"step": 50, "epoch": 0}\n{"step": 100, "epoch": 1}\n')
    rows = levers_json({"baseline": base, "lk": lk}, "baseline", None)  # a corpus under the budget: said so
    assert rows[1]["epochs"] == 2 and "| 1,000,000 (2 epochs: repeated) |" in "\n".join(section(rows, None, "f"))
    assert [ln.endswith("| - |") for ln in page.splitlines() if ln.startswith("| ")][1:] == [False, False, True]
    # a carry-over eval at other settings does not pair
    odd = _lever_arm(tmp_path, "augment", 100, [(4, 4)] * 4, num_prompts=3, carry=True)
    report = odd / "eval-mt_bench" / "report.json"
    report.write_text(report.read_text().replace('"num_prompts": 3', '"num_prompts": 4'))
    for bench in ("gsm8k", "sharegpt"):
        r = odd / f"eval-{bench}" / "report.json"
        r.write_text(r.read_text().replace('"num_prompts": 3', '"num_prompts": 4'))
    with pytest.raises(ValueError, match="humaneval eval differs"):
        levers_json({"baseline": base, "augment": odd}, "baseline", None)
    # without the baseline's, no pair: the value alone
    rows = levers_json(
        {"baseline": _lever_arm(tmp_path / "b", "baseline", 100, [(4, 4)] * 4), "s": synth}, "baseline", None
    )
    assert rows[1]["humaneval_tau"] == 2.5 and "humaneval_delta" not in rows[1]


def test_recipe_levers_pair_an_arm_with_the_data_tables_baseline_and_record_its_k_and_cpu(tmp_path):
    """`report_levers.py --table recipe_levers`: an arm that changes a training setting (TTT K=5) on the
    baseline's data is paired with the data table's stored baseline (its run folder gone), and its row
    says the K it trained and the core-seconds its training took."""
    from benchmarks.smollm2.report_levers import levers_json, table_rows

    base = _lever_arm(tmp_path, "baseline", 100, [(4, 4)] * 4)
    data = {"data_levers": levers_json({"baseline": base}, "baseline", start_tau=None)}
    k5 = _lever_arm(tmp_path, "ttt5", 100, [(8, 4), (4, 4), (4, 4), (4, 4)])
    manifest = k5 / "train" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["config"]["ttt_steps"], m["final_metrics"] = 5, {"train_cpu_seconds": 2586.11}
    manifest.write_text(json.dumps(m))
    rows = table_rows(data, "recipe_levers", {"ttt5": k5})
    by = {r["arm"]: r for r in rows}
    assert [r["arm"] for r in rows] == ["baseline", "ttt5"] and by["ttt5"]["delta_vs_baseline"] == 0.25
    assert (by["ttt5"]["ttt_steps"], by["ttt5"]["cpu_seconds"]) == (5, 2586)
    data["recipe_levers"] = rows
    again = table_rows(data, "recipe_levers", {"ttt5": None})  # a later report keeps the stored rows
    assert again == rows and table_rows(data, "data_levers", {}) == data["data_levers"]


def test_recipe_levers_take_an_arm_at_equal_cpu_seconds_and_cost_the_baseline_on_its_batches(tmp_path):
    """An arm trained to a CPU budget (--time-budget-s --time-clock cpu) joins the table at the steps the budget
    bought; a step-budgeted arm trains the baseline's steps or is refused. The baseline (its run predating CPU
    seconds) is costed by the equal-CPU arm of its K at its step, and every row carries the draft step's cost."""
    from benchmarks.smollm2.report_levers import levers_json, table_rows
    from benchmarks.smollm2.report_page import page as render_page

    base = _lever_arm(tmp_path, "baseline", 100, [(4, 4)] * 4)
    cost = {"draft_step_cost": {"by_draft_vocab": {"16384": {"ms": 1.0, "target_tokens": 0.06}}}}
    data = {"data_levers": levers_json({"baseline": base}, "baseline", start_tau=None), **cost}
    k3 = _lever_arm(tmp_path, "ttt3-cpu", 100, [(8, 4), (4, 4), (4, 4), (4, 4)])
    manifest = k3 / "train" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["config"].update(max_steps=None, time_budget_s=300.0, time_clock="cpu")
    m["final_metrics"] = {"train_cpu_seconds": 300.4}
    manifest.write_text(json.dumps(m))
    logged = [{"step": s, "epoch": 0, "train_cpu_seconds": s * 1.5} for s in (50, 100, 150, 200)]
    (k3 / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    k7 = _lever_arm(tmp_path, "ttt7", 100, [(4, 4)] * 4)  # at the baseline's steps, costing the CPU budget
    m7 = json.loads((k7 / "train" / "manifest.json").read_text())
    m7["config"]["ttt_steps"], m7["final_metrics"] = 7, {"train_cpu_seconds": 299.6}
    (k7 / "train" / "manifest.json").write_text(json.dumps(m7))
    by = {r["arm"]: r for r in table_rows(data, "recipe_levers", {"ttt3-cpu": k3, "ttt7": k7})}
    assert (by["ttt3-cpu"]["steps"], by["ttt3-cpu"]["cpu_seconds"], by["ttt3-cpu"]["cpu_budget_s"]) == (200, 300, 300.0)
    assert (
        by["baseline"]["cpu_seconds"] == 150
        and "ttt3-cpu at step 100 (same batches)" == by["baseline"]["cpu_seconds_from"]
    )
    assert {r["draft_step_cost"] for r in by.values()} == {0.06}
    assert by["ttt3-cpu"]["mt_bench_alpha_k"] == [0.5, None]  # a depth never attempted has no alpha
    page = render_page({**data, "recipe_levers": list(by.values())})
    assert "| ttt3-cpu | 3 | 0.500 | - | 2.250 |" in page  # a depth with no attempt: "-"
    # the budget is what K=7's steps cost, so K=7's equal-CPU arm is that row: the page says so
    assert "what ttt7's 100 steps cost on its machine: K=7 at equal CPU seconds is ttt7 itself." in page
    assert "--time-budget-s=300 " in page
    del m["config"]["time_budget_s"]  # the same steps without a CPU budget: another step budget, refused
    manifest.write_text(json.dumps(m))
    with pytest.raises(ValueError, match="different budgets"):
        table_rows(data, "recipe_levers", {"ttt3-cpu": k3})


def test_epoch_curve_pairs_each_pass_with_the_one_before_and_renders_its_section_and_figure(tmp_path):
    """benchmarks/smollm2/epoch_curve.py's result: each pass after the first carries its MT-bench change over
    the pass before, paired by prompt; the page's section names the peak passes and draws the figure."""
    from benchmarks.smollm2.epoch_curve import paired_passes
    from benchmarks.smollm2.report_page import draw_figures
    from benchmarks.smollm2.report_page import page as render_page

    rounds = [4, 4, 4, 4]
    accepted = {
        1: [2, 2, 2, 2],
        2: [6, 6, 2, 2],
        3: [4, 4, 2, 2],
    }  # pass 2 gains on two prompts, pass 3 gives half back
    points = [{"pass": p, "steps": 10 * p, "loss": 5.0 - p, "heldout_tau": 1.5 + 0.1 * p, "tokens_seen": 1000 * p,
               "train_cpu_seconds": 60 * p, "mt_bench_tau": sum(a) / 16 + 1,
               "mt_bench_per_prompt": {"emitted": [x + 4 for x in a], "rounds": rounds}}
              for p, a in accepted.items()]  # fmt: skip
    curve = {"points": paired_passes(points), "samples": 8, "data": "corpora/x", "recipe": "online",
             "eval": "MT-bench", "command": "epoch_curve.py --passes 3"}  # fmt: skip
    assert "delta_vs_previous" not in points[0]
    assert points[1]["delta_vs_previous"] == 0.5 and points[2]["delta_vs_previous"] == -0.25
    lo, hi = points[2]["delta_interval"]
    assert -0.5 <= lo <= -0.25 <= hi <= 0.0  # no prompt gained in pass 3: the interval never crosses zero
    text = render_page({"epoch_curve": curve})
    assert "MT-bench tau peaks at pass 2 (2.000) and held-out tau at pass 3 (1.800) of 3" in text
    assert "| 3 | 30 | 3,000 | 180 | 2.000 | 1.800 | 1.750 | -0.250 [" in text
    assert draw_figures({"epoch_curve": curve}, tmp_path) == ["results-epoch-curve.png"]
    assert (tmp_path / "results-epoch-curve.png").stat().st_size > 0


def test_recipe_levers_pair_scratch_arms_with_the_scratch_baseline_and_cost_only_the_published_shape(tmp_path):
    """Arms that change the head's shape train from no head (levers.py --scratch, named scratch-*) and pair with
    the from-scratch `scratch` at their own budget, not with the published head's baseline; each row's draft step
    is its own draft vocab's as round_cost.py measured it, none where it was not."""
    from benchmarks.smollm2.report_levers import levers_json, table_rows

    base = _lever_arm(tmp_path, "baseline", 100, [(4, 4)] * 4)
    cost = {"draft_step_cost": {"by_draft_vocab": {"16384": {"target_tokens": 0.06}, "32768": {"target_tokens": 0.09}}}}
    data = {"data_levers": levers_json({"baseline": base}, "baseline", start_tau=1.5), **cost}
    scratch = _lever_arm(tmp_path, "scratch", 138, [(2, 4)] * 4)
    wide = _lever_arm(tmp_path, "scratch-vocab32k", 138, [(4, 4), (2, 4), (2, 4), (2, 4)])
    manifest = wide / "train" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["config"]["draft_vocab_size"] = 32768
    manifest.write_text(json.dumps(m))
    with pytest.raises(KeyError, match="baseline arm 'scratch'"):
        table_rows(data, "recipe_levers", {"scratch-vocab32k": wide})
    rows = table_rows(data, "recipe_levers", {"scratch": scratch, "scratch-vocab32k": wide})
    by = {r["arm"]: r for r in rows}
    assert [r["arm"] for r in rows] == ["baseline", "scratch", "scratch-vocab32k"]
    assert by["scratch-vocab32k"]["delta_vs_baseline"] == 0.125 and by["scratch"]["delta_vs_baseline"] == 0.0
    assert by["scratch-vocab32k"]["tau_gain_per_million_tokens"] is None  # not from the published head
    assert (by["baseline"]["draft_step_cost"], by["scratch"]["draft_step_cost"]) == (0.06, 0.06)
    assert by["scratch-vocab32k"]["draft_step_cost"] == 0.09
    data["recipe_levers"] = rows
    assert table_rows(data, "recipe_levers", {}) == rows  # both groups kept from the JSON
    del data["draft_step_cost"]["by_draft_vocab"]["32768"]
    assert (
        table_rows(data, "recipe_levers", {"scratch": scratch, "scratch-vocab32k": wide})[2]["draft_step_cost"] is None
    )


def test_recipe_levers_pair_arms_from_the_published_head_with_its_own_eval_side_by_side(tmp_path):
    """`report_levers.py --vs-published DIR`: the published head's MT-bench eval, kept in the JSON, pairs every
    arm that starts from that head (not scratch-*); an eval of another bench, head or settings is refused; the
    page names the arms paired above zero over the published head."""
    from benchmarks.smollm2.report_levers import levers_json, published_eval, table_rows
    from benchmarks.smollm2.report_page import page as render_page

    base = _lever_arm(tmp_path, "baseline", 100, [(4, 4)] * 4)
    data = {"data_levers": levers_json({"baseline": base}, "baseline", start_tau=1.5),
            "published": {"mt_bench_tau": 1.5}}  # fmt: skip
    k3 = _lever_arm(tmp_path, "ttt3-cpu", 100, [(8, 4), (8, 4), (8, 4), (6, 4)])
    scratch = _lever_arm(tmp_path, "scratch", 138, [(2, 4)] * 4)
    pub = _lever_arm(tmp_path, "published", 0, [(4, 4), (4, 4), (4, 4), (5, 4)])
    report = pub / "eval-mt_bench" / "report.json"
    rep = json.loads(report.read_text())
    with pytest.raises(ValueError, match="expected MT-bench's of models/smollm2-135m-eagle3"):
        published_eval(pub / "eval-mt_bench")  # the eval of some other head
    rep["heads"] = {"models/smollm2-135m-eagle3": rep["heads"]["published/head"]}
    report.write_text(json.dumps(rep | {"bench": "gsm8k"}))
    with pytest.raises(ValueError, match="is gsm8k's eval of models/smollm2-135m-eagle3, expected MT-bench's"):
        published_eval(pub / "eval-mt_bench")  # the published head, another bench
    report.write_text(json.dumps(rep))
    data["recipe_levers_vs_published"] = published_eval(pub / "eval-mt_bench")
    rows = table_rows(data, "recipe_levers", {"ttt3-cpu": k3, "scratch": scratch})
    by = {r["arm"]: r for r in rows}
    assert (
        by["ttt3-cpu"]["delta_vs_published"] == 2.875 - 2.0625 and by["ttt3-cpu"]["delta_vs_published_interval"][0] > 0
    )
    assert by["baseline"]["delta_vs_published"] == 2.0 - 2.0625
    assert "delta_vs_published" not in by["scratch"]  # another starting point: not paired with the published head
    text = render_page({**data, "recipe_levers": rows})
    assert "ttt3-cpu +0.812 [+" in text and "Paired above zero over the published head: ttt3-cpu." in text
    rep["max_new_tokens"] = 128
    report.write_text(json.dumps(rep))
    data["recipe_levers_vs_published"] = published_eval(pub / "eval-mt_bench")
    with pytest.raises(ValueError, match="differs from baseline's MT-bench eval"):
        table_rows(data, "recipe_levers", {"ttt3-cpu": k3})
