"""The results page's keys (benchmarks/smollm2/publish.py, report.py) on hand-made run folders: the learning-curve
projection, the sweep's best configuration, the published head's keys; and the
page rendered from them."""

from __future__ import annotations

import json
import math
import sys

import pytest

from benchmarks.common import REPO
from benchmarks.smollm2.publish import curve_keys, heldout_curve, projection, sweep_summary


def _run(tmp_path, name, taus, budget=3600.0):
    run = tmp_path / name
    (run / "train").mkdir(parents=True)
    lines = [json.dumps({"step": 5, "loss": 9.0, "tokens_seen": 10})]  # an interval with no held-out point
    for i, tau in enumerate(taus, 1):
        point = {"step": 200 * i, "tokens_seen": 1000 * 2**i, "train_cpu_seconds": 100.0 * 2**i}
        lines.append(json.dumps(point | {"train_seconds": 110.0 * 2**i, "heldout_tau": tau}))
    (run / "train" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    cfg = {"time_budget_s": budget, "heldout_every": 200, "ttt_steps": 3}
    (run / "train" / "manifest.json").write_text(json.dumps({"config": cfg}))
    return run


def test_curve_keeps_only_heldout_points_and_projection_follows_the_line(tmp_path):
    run = _run(tmp_path, "r", [1.0 + 0.1 * i for i in range(1, 9)])  # +0.1 per doubling of tokens
    curve = heldout_curve(run)
    assert [p["steps"] for p in curve] == [200 * i for i in range(1, 9)]
    proj = projection(curve)
    assert proj["tau_per_doubling_of_tokens"] == pytest.approx(0.1)
    # tau = 1 + 0.1 * log2(tokens / 1000): 2.5 at 2**15 * 1000 tokens
    assert proj["tokens_for_goal"] == pytest.approx(1000 * 2**15, rel=1e-6)


def test_a_flat_or_short_curve_projects_nothing(tmp_path):
    flat = heldout_curve(_run(tmp_path, "flat", [1.2] * 6))
    assert "tokens_for_goal" not in projection(flat)
    assert projection(heldout_curve(_run(tmp_path, "short", [1.1, 1.2]))) is None


def test_sweep_summary_names_the_fastest_configuration(tmp_path):
    configs = [
        {"name": f"chain d={d}", "mode": "chain", "tau": 1 + 0.1 * d, "speedup": s, "speedup_interval": [s - 0.1, s]}
        for d, s in ((1, 1.12), (2, 1.18), (3, 0.95))
    ]
    for c in configs:
        c["greedy_mismatches"] = 0
    report = {"dtype": "fp32", "sweep": {"configurations": configs, "prompts": ["a", "b"], "max_new_tokens": 64}}
    report["sweep"]["recommended"] = {"mode": "chain", "steps": 2}
    s = sweep_summary(report)
    assert (s["best"], s["speedup_vs_plain"], s["prompts"]) == ("chain d=2", 1.18, 2)
    assert sweep_summary({"heads": {}}) is None
    data = curve_keys(heldout_curve(_run(tmp_path, "smollm2", [1.2, 1.5, 1.6])), {"mt_bench": report})
    assert data["sweep"]["bf16"] is None and math.isclose(data["sweep"]["fp32"]["speedup_vs_plain"], 1.18)
    assert "one_core_hour" not in data and "bar_issue22" not in data  # no work-item tables in the data


def test_a_long_run_is_published_and_the_equal_compute_pair_stays_in_out(tmp_path):
    """run_bench.py: after the long run its head is the one evaluated (OUT-long/eval-*) and its curve is
    the learning curve; K=1 vs the recipe's K compare the two one-core-hour heads in OUT."""
    from benchmarks.smollm2.publish import eval_rows
    from benchmarks.smollm2.run_bench import eval_dir

    out = _run(tmp_path, "smollm2", [1.2, 1.5, 1.6])
    long = _run(tmp_path, "smollm2-long", [1.3, 1.7, 1.8, 1.9], budget=9000.0)
    assert eval_dir(out, long, "mt_bench") == long / "eval-mt_bench"
    assert eval_dir(out, long, "ttt1_mt_bench") == out / "eval-ttt1_mt_bench"
    assert eval_dir(out, long, "ttt_k_mt_bench") == out / "eval-ttt_k_mt_bench"
    assert eval_dir(out, out, "ttt_k_mt_bench") == out / "eval-mt_bench"  # no long run: the same eval

    def report(tau):
        per_depth = [{"alpha": 0.5, "attempts": 10, "unconditional": 0.5}]
        chain = {"acceptance": {"tau": tau, "per_depth": per_depth}, "lossless": {"mismatches": 0}}
        return {
            "bench": "mt_bench",
            "depth": 8,
            "num_prompts": 80,
            "temperature": 0.0,
            "heads": {"h": {"chain": chain}},
        }

    for folder, tau in (
        (long / "eval-mt_bench", 1.7),
        (out / "eval-ttt_k_mt_bench", 1.5),
        (out / "eval-mt_bench", 1.4),
    ):
        folder.mkdir(parents=True)
        (folder / "report.json").write_text(json.dumps(report(tau)))
    rows, _ = eval_rows(long, ("mt_bench", "gsm8k"))  # a run's evals: one it has not run is left out
    assert [(r["eval"], r["tau"]) for r in rows] == [("mt_bench", 1.7)]
    data = curve_keys(heldout_curve(long), {})
    assert [p["heldout_tau"] for p in data["learning_curve"]] == [1.3, 1.7, 1.8, 1.9]
    # the MT-bench projection runs through two heads' eval tau: 8k tokens 1.5, 16k 1.7
    points = [{"run": "smollm2", "tokens": 8000, "tau": 1.5}, {"run": "smollm2-long", "tokens": 16000, "tau": 1.7}]
    proj = curve_keys([], {}, points[::-1])["mt_bench_projection"]
    assert [(p["run"], p["tokens"], p["tau"]) for p in proj["points"]] == [
        ("smollm2", 8000, 1.5),
        ("smollm2-long", 16000, 1.7),
    ]
    assert proj["tau_per_doubling_of_tokens"] == pytest.approx(0.2)
    assert proj["tokens_for_goal"] == pytest.approx(16000 * 2**4, rel=1e-6)  # 1.7 + 4 x 0.2 = 2.5


def test_llama_cpp_summary_picks_the_best_k_and_ngram_from_the_rows():
    from benchmarks.llama_cpp.run_bench import summarise

    def row(who, k, speedup, drafted, differ=0):
        first = [None] * (10 - differ) + [29] * differ
        return {"speculator": who, "k": k, "speedup": speedup, "draft_n": drafted, "outputs_differ": differ,
                "first_difference": first}  # fmt: skip

    rows = [row("eagle3", 1, 0.9, 50, 1), row("eagle3", 2, 1.1, 90), row("ngram-simple", None, 1.02, 7)]
    rows.append(row("ngram-cache", None, 1.2, 0))  # drafted nothing: plain llama-server, its ratio is noise
    lc = summarise(rows)
    assert lc["best_k"] == 2 and lc["best_speedup_vs_plain"] == 1.1 and lc["rows"] == rows
    assert lc["best_ngram"] == "ngram-simple" and lc["best_ngram_speedup_vs_plain"] == 1.02
    assert lc["ngrams_that_drafted_nothing"] == ["ngram-cache"]
    assert lc["identical"] is False and lc["greedy_outputs_identical"]["eagle3 k=1"] == "9/10"


def _eval_report(tau: float, sweep_speedup: float | None = None) -> dict:
    per_depth = [{"alpha": 0.5, "attempts": 10, "unconditional": 0.5}]
    acc = {"tau": tau, "tau_interval": [tau - 0.05, tau + 0.05], "per_depth": per_depth}
    rep = {"bench": "mt_bench", "depth": 8, "num_prompts": 80, "temperature": 0.0, "dtype": "fp32"}
    rep["heads"] = {"h": {"chain": {"acceptance": acc, "speedup_vs_plain": 0.9, "lossless": {"mismatches": 0}}}}
    if sweep_speedup is not None:
        conf = {"name": "chain d=1", "tau": tau - 0.3, "speedup": sweep_speedup, "greedy_mismatches": 0}
        conf["speedup_interval"] = [sweep_speedup - 0.05, sweep_speedup + 0.05]
        rep["sweep"] = {"configurations": [conf], "prompts": ["a"] * 8, "max_new_tokens": 64, "recommended": {}}
    return rep


def _page(tmp_path):
    """A results page before a publish: the head before the sessions, and the pair's row."""
    md = tmp_path / "results.md"
    old_rows = [
        {"eval": "mt_bench", "decoder": "chain", "tau": 1.5, "head": "smollm2-long/head", "prompts": 80},
        {"eval": "ttt1_mt_bench", "decoder": "chain", "tau": 1.4, "head": "smollm2-ttt1/head", "prompts": 80},
    ]
    for r in old_rows:
        r |= {"bench": "mt_bench", "turns": "first", "temperature": 0.0, "speedup_vs_plain": 0.8, "depth": 8}
        r |= {"greedy_mismatches": 0, "speedup_vs_generate": None, "alpha_k": [0.4], "unconditional_k": [0.4]}
    curve = [{"tokens": 1000 * 2**i, "steps": i, "seconds": 1.0 * i, "cpu_seconds": 2.0 * i, "heldout_tau": 1.2}
             for i in (1, 2)]  # fmt: skip
    before = {"head": "smollm2-long/head", "mt_bench_tau": 1.5, "learning_curve": curve}
    md.with_suffix(".json").write_text(json.dumps({"rows": old_rows, "learning_curve": curve,
                                                   "published_before_sessions": before}))  # fmt: skip
    md.write_text("# page\n\nold text, rendered over by every publish\n")
    return md


def _session(tmp_path, name, taus, skip, init, by_folder=None, train_samples=10):
    run = _run(tmp_path, name, [])
    lines = [{"step": 0, "tokens_seen": 0, "train_seconds": 0.0, "train_cpu_seconds": 0.0, "heldout_tau": taus[0]}]
    lines += [
        {"step": 100 * i, "tokens_seen": 500 * i, "train_seconds": 10.0 * i, "train_cpu_seconds": 20.0 * i,
         "heldout_tau": t} for i, t in enumerate(taus[1:], 1)
    ]  # fmt: skip
    (run / "train" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = {"data": "corpora/c", "skip_samples": skip, "train_samples": train_samples, "init_head": init}
    m = {"config": cfg, "steps": 100, "tokens_seen": 500, "trained_samples": 10}
    m |= {"trained_by_folder": by_folder} if by_folder else {}
    (run / "train" / "manifest.json").write_text(json.dumps(m))
    (run / "head").mkdir()
    return run


def test_a_head_trained_across_sessions_is_published_over_the_pages_head_and_keeps_the_rest(tmp_path):
    """publish.py's report: the last session's evals replace the published head's rows, sweeps and
    keys; the learning curve runs on from the head before (a later session's step 0 dropped); the
    equal-compute pair's rows stay; the page is rendered from the JSON; publishing twice changes nothing."""
    from benchmarks.smollm2.publish import PublishError, publish_report

    md = _page(tmp_path)
    s1 = _session(tmp_path, "long-s1", [2.0, 2.1], 0, "models/h")
    by_folder = [
        {"folder": "corpora/c", "samples": 10, "tokens": 400},
        {"folder": "corpora/g", "samples": 4, "tokens": 100},
    ]
    s2 = _session(tmp_path, "long-s2", [2.1, 2.3], 10, "models/next", by_folder)
    evals = {"mt_bench": None, "mt_bench_bf16": None}
    with pytest.raises(PublishError, match="no MT-bench eval"):
        publish_report(md, [s1, s2], evals, {})
    for name, rep in (("mt_bench", _eval_report(1.8, 1.21)), ("mt_bench_bf16", _eval_report(1.7, 1.31))):
        (s2 / f"eval-{name}").mkdir()
        (s2 / f"eval-{name}" / "report.json").write_text(json.dumps(rep))
        cfg = {"bench": "mt_bench", "run": str(s2), "target": str(REPO / "models" / "smollm2-135m")}
        (s2 / f"eval-{name}" / "manifest.json").write_text(json.dumps({"config": cfg}))
    steps = {"eval_mt_bench": {"seconds": 600.0, "peak_rss_mib": 2000.0, "command": "eagle3 eval --bench mt_bench"}}
    data = publish_report(md, [s1, s2], evals, steps)
    assert data["commands"]["published"][1:] == ["eagle3 eval --bench mt_bench"]  # each eval as publish.py ran it

    assert [(r["eval"], r["tau"]) for r in data["rows"]] == [
        ("mt_bench", 1.8), ("mt_bench_bf16", 1.7), ("ttt1_mt_bench", 1.4)
    ]  # fmt: skip
    assert data["rows"][0]["tau_interval"] == [1.75, 1.85]  # kept for a later partial report
    curve = data["learning_curve"]
    assert [(p["tokens"], p["heldout_tau"], p.get("session")) for p in curve] == [
        (2000, 1.2, None), (4000, 1.2, None), (4000, 2.0, "long-s1"), (4500, 2.1, "long-s1"), (5000, 2.3, "long-s2")
    ]  # fmt: skip
    assert curve[-1]["cpu_seconds"] == 4.0 + 20.0 + 20.0
    assert data["published"]["mt_bench_tau_before"] == 1.5 and data["published"]["trained_tokens"] == 5000
    assert [s["samples"] for s in data["published"]["sessions"]] == [[0, 9], [10, 19]]
    assert data["sweep"]["fp32"]["speedup_vs_plain"] == 1.21 and data["sweep"]["bf16"]["speedup_vs_plain"] == 1.31
    assert "bar_issue22" not in data
    text = md.read_text()
    assert "old text" not in text and "| mt_bench | mt_bench | first | 0.0 | chain | 80 | 1.80 [1.75, 1.85] |" in text
    assert "| chain d=1 | 1.50 / 1.21x | 1.40 / 1.31x |" in text  # the sweeps, fp32 and bf16
    assert "| ttt1_mt_bench |" in text and "long-s2`) on each bench" in text
    assert "| eval mt_bench | - | 10.0 min | - | - | 2000 MiB |" in text  # this publish's eval cost
    assert "long-s1` | `models/h` (then: smollm2-long/head) | 0-9 | 100 | 500 | 2.000 -> 2.100 |" in text  # sessions
    assert "long-s2` | `models/next` | 10-19 + 4 of `corpora/g` | 100 | 500 |" in text  # a source that joined
    assert "Issue" not in text and "bar" not in text  # no work-item tables on the user's page
    again = publish_report(md, [s1, s2], evals, steps)
    assert again["learning_curve"] == curve and again["published_before_sessions"]["mt_bench_tau"] == 1.5
    assert md.read_text() == text
    assert "```\n.venv/bin/python benchmarks/smollm2/publish.py --sessions " in text  # the commands, on the page
    assert text.endswith("long-s2\neagle3 eval --bench mt_bench\n```\n")
    assert str(REPO) not in text
    # the figures are drawn from the same JSON, beside the page
    assert (tmp_path / "results-smollm2-learning-curve.png").stat().st_size > 0


def test_publish_refuses_a_session_that_did_not_finish_with_exit_2(tmp_path, capsys):
    from benchmarks.smollm2 import publish

    with pytest.raises(SystemExit) as e:
        publish.check_sessions([tmp_path / "long-s9"])
    assert e.value.code == 2
    assert "not a finished training run" in capsys.readouterr().err


def test_publish_refuses_an_eval_folder_it_did_not_write_with_exit_2(tmp_path, capsys):
    """A hand-run eval left in LAST/eval-NAME would be published in place of the page's eval."""
    import argparse

    from benchmarks.common import Recorder
    from benchmarks.smollm2 import publish

    last = tmp_path / "long-s9"
    args = argparse.Namespace(mt_bench_prompts=80, eval_prompts=40, max_new_tokens=64, sampling_prompts=20,
                              sweep_prompts=8, threads=1)  # fmt: skip
    evals = publish.published_evals(last, args)
    name = next(iter(evals))
    (last / f"eval-{name}").mkdir(parents=True)
    (last / f"eval-{name}" / "report.json").write_text("{}")
    rec = Recorder()
    run, bench, prompts, extra = evals[name]
    planned = rec.show(publish.eval_cmd(run, last / f"eval-{name}", bench, prompts, args, *extra))
    for steps, said in (({}, "was not written by publish.py"),
                        ({f"eval_{name}": {"command": planned.replace("64", "128")}}, "was run as")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            publish.check_done_evals(last, evals, steps, args, rec)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert said in err and f"eval-{name}" in err and "Move that folder aside" in err
    publish.check_done_evals(last, evals, {f"eval_{name}": {"command": planned}}, args, rec)  # its own: kept


def test_publish_continue_keeps_the_pages_sessions_when_their_run_folders_are_gone(tmp_path):
    """A new machine has no runs/: `publish.py --continue --sessions runs/long-s3` keeps sessions 1-2
    as the page publishes them, counts session 3's tokens on from their end, writes the same page
    when run twice, and refuses a session that would skip or repeat the corpus's samples."""
    import shutil

    from benchmarks.smollm2.publish import PublishError, publish_report

    md = _page(tmp_path)
    evals = {"mt_bench": None}
    runs = [_session(tmp_path, "long-s1", [2.0, 2.1], 0, "models/h"),
            _session(tmp_path, "long-s2", [2.1, 2.3], 10, "models/next")]  # fmt: skip
    rest = [{"folder": "corpora/c", "samples": 10, "tokens": 400}, {"folder": "corpora/g", "samples": 3, "tokens": 100}]
    # the last session trains on all the rest (no --train-samples): its range comes from its manifest
    runs.append(_session(tmp_path, "long-s3", [2.3, 2.4], 20, "models/next", rest, train_samples=None))
    skipping = _session(tmp_path, "long-s4", [2.3, 2.4], 25, "models/next")
    for s in [*runs[1:], skipping]:
        (s / "eval-mt_bench").mkdir()
        (s / "eval-mt_bench" / "report.json").write_text(json.dumps(_eval_report(1.8)))
    with pytest.raises(PublishError, match="publishes none"):  # nothing published yet to keep
        publish_report(md, runs[2:], evals, {}, keep=True)
    published = publish_report(md, runs[:2], evals, {})
    for s in runs[:2]:
        shutil.rmtree(s)
    with pytest.raises(PublishError, match="from sample 25 of corpora/c, expected 20"):
        publish_report(md, [skipping], evals, {}, keep=True)

    data = publish_report(md, runs[2:], evals, {}, keep=True)
    assert [s["samples"] for s in data["published"]["sessions"]] == [[0, 9], [10, 19], [20, 29]]
    curve = data["learning_curve"]
    assert curve[:-1] == published["learning_curve"]  # session 3's step 0 re-measures session 2's end
    assert (curve[-1]["tokens"], curve[-1]["session"], curve[-1]["heldout_tau"]) == (5500, "long-s3", 2.4)
    assert data["published"]["trained_tokens"] == 5500 and data["published"]["run"].endswith("long-s3")
    text = md.read_text()
    assert "publish.py --continue --sessions" in text and "`--continue` kept" in text
    again = publish_report(md, runs[2:], evals, {}, keep=True)
    assert again["published"]["sessions"] == data["published"]["sessions"] and md.read_text() == text


def test_publish_continue_refuses_a_gap_before_running_any_eval(tmp_path, monkeypatch, capsys):
    """`publish.py --continue` with a session that skips samples exits 2 before its hour of evals."""
    from benchmarks.smollm2 import publish
    from benchmarks.smollm2.publish import publish_report

    md = _page(tmp_path)
    s1 = _session(tmp_path, "long-s1", [2.0, 2.1], 0, "models/h")
    (s1 / "eval-mt_bench").mkdir()
    (s1 / "eval-mt_bench" / "report.json").write_text(json.dumps(_eval_report(1.8)))
    publish_report(md, [s1], {"mt_bench": None}, {})
    gap = _session(tmp_path, "long-s2", [2.1, 2.2], 15, "models/next")
    monkeypatch.setattr(sys, "argv", ["publish.py", "--continue", "--sessions", str(gap), "--results-md", str(md)])
    with pytest.raises(SystemExit) as e:
        publish.main()
    assert e.value.code == 2 and "from sample 15 of corpora/c, expected 10" in capsys.readouterr().err
    assert sorted(p.name for p in gap.iterdir()) == ["head", "train"]  # no eval ran


def test_record_writes_one_key_of_a_section_and_keeps_the_others(tmp_path):
    from benchmarks.common import record

    page = tmp_path / "results.json"
    page.write_text(json.dumps({"rows": [1], "llama_cpp": {"round_cost": {"rounds": [2]}}}))
    record(page, "llama_cpp.round_cost.eagle3_decoder", {"rows": [3]})
    record(page, "corpus", {"conversations": 4})
    assert json.loads(page.read_text()) == {
        "rows": [1],
        "llama_cpp": {"round_cost": {"rounds": [2], "eagle3_decoder": {"rows": [3]}}},
        "corpus": {"conversations": 4},
    }
    assert page.read_text().endswith("}\n") and not (tmp_path / "results.md").exists()  # no page rendered
