"""The results pages are data: docs/results-smollm2.md and the README's results table are rendered
from docs/results-smollm2.json by one renderer (benchmarks/render.py), byte for byte; a section for a
new key is one spec; the README stays short and its commands exist."""

from __future__ import annotations

import copy
import json
import re

import pytest
from jinja2.exceptions import UndefinedError

from benchmarks.common import REPO
from benchmarks.render import TEMPLATES, rows_table
from benchmarks.smollm2.report_page import README, page, readme_table, readme_with_table

DATA = json.loads((REPO / "docs" / "results-smollm2.json").read_text(encoding="utf-8"))


def test_the_smollm2_page_regenerates_byte_for_byte_from_its_json():
    assert page(DATA) == (REPO / "docs" / "results-smollm2.md").read_text(encoding="utf-8")


def test_the_readme_results_table_is_the_jsons():
    readme = README.read_text(encoding="utf-8")
    assert readme_with_table(readme, DATA) == readme
    assert readme_table(DATA) in readme


def test_a_number_changed_in_the_json_changes_the_page_and_the_readme_table():
    d = copy.deepcopy(DATA)
    d["engine_speedup"]["vllm_cpu"]["speedup_vs_plain"] = 1.987
    d["rows"][0]["tau"] = 2.468
    table = readme_table(d)
    assert "| 1.99x |" in table and "| 2.47 |" in table
    assert "| 2.47 [" in page(d) and page(d) != page(DATA)


def test_the_user_page_holds_no_work_item_tables():
    text = page(DATA)
    assert not re.search(r"(?i)issue \d+|\| criterion \| bar \||missed bars", text)
    assert not any(k.startswith("bar_issue") for k in DATA)


def test_a_gpu_check_section_says_it_has_not_run_until_its_key_exists():
    assert "## On a GPU\n\nNot yet run on a GPU: `python tools/gpu_check.py" in page(DATA)
    assert "not yet run on a GPU" in readme_table(DATA)
    d = copy.deepcopy(DATA)
    d["gpu_check"] = {"device": "H100", "checks": [{"check": "serve sglang", "passed": True, "seconds": 12.5}]}
    text = page(d)
    assert (
        "Not yet run" not in text
        and "| check | passed | seconds |" in text
        and "| serve sglang | yes | 12.500 |" in text
    )
    assert "[GPU](docs/results-smollm2.md#on-a-gpu)" in readme_table(d)


def test_absent_or_empty_keys_leave_their_sections_out():
    bare = page({})
    assert re.findall(r"^## .*", bare, re.M) == ["## On a GPU"] and bare.endswith("passed.\n")
    # a key written empty (a run that measured nothing there) is left out as an absent one is
    assert page({"costs": [], "data_levers": [], "sweep": {"fp32": None, "bf16": None}}) == bare
    d = {"costs": [{"stage": "cache", "tokens": "9", "minutes": 1.25, "estimated": True, "tok_s": "3",
                    "bytes_per_token": 4617, "peak_rss_mib": None}]}  # fmt: skip
    assert "## Costs\n\n| stage |" in page(d) and "| cache | 9 | 1.2 min (est.) | 3 | 4,617 | - |" in page(d)
    # a dict of records by name: one row each, the name first
    assert rows_table({"a": {"tau": 2}, "b": {"tau": 3}}) == "| name | tau |\n|---|---|\n| a | 2 |\n| b | 3 |"


def test_a_key_the_template_reads_without_get_must_be_in_the_json():
    d = copy.deepcopy(DATA)
    del d["equal_budget"]["budget_cpu_s"]
    with pytest.raises(UndefinedError, match="budget_cpu_s"):
        page(d)


def test_every_section_of_the_page_reads_a_key_the_json_holds():
    template = (TEMPLATES / "results-smollm2.md.j2").read_text(encoding="utf-8")
    keys = re.findall(r"^\{% if d\.get\('(\w+)'\) %\}$", template, re.M)
    assert len(keys) >= 15 and [k for k in keys if k not in DATA] == ["gpu_check"]


def test_the_readme_is_short_and_its_make_targets_exist():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 110
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    used = set(re.findall(r"\bmake ([a-z][\w-]*)", text))
    assert {"install", "demo", "test", "test-all"} <= used and used <= targets
    # nothing about this repository's own machines or sessions
    assert not re.search(r"(?i)our build machines|this 2-core machine|sessions?\b|nice 5", text)
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).exists(), link


def test_the_tiny_bench_page_regenerates_byte_for_byte_from_its_json():
    from benchmarks.tiny.report import page as tiny_page

    data = json.loads((REPO / "docs" / "results.json").read_text(encoding="utf-8"))
    assert tiny_page(data) == (REPO / "docs" / "results.md").read_text(encoding="utf-8")


def test_a_tiny_bench_run_becomes_the_pages_json_without_the_machines_paths(tmp_path):
    """report.py --results: the run's numbers (not its folders) are kept beside the page, the page and its
    figures rendered from them; a claim's reading follows the numbers."""
    import subprocess
    import sys

    run = json.loads((REPO / "docs" / "results.json").read_text(encoding="utf-8"))
    run["settings"] |= {"out": str(REPO / "runs" / "bench"), "results_md": str(tmp_path / "results.md")}
    run["commands"] = [f"eagle3 cache --out {REPO}/runs/bench/x", *run["commands"]]
    run["evals"]["ttt1"]["chain"]["tau"] = 9.0  # K=1 beats TTT here: the TTT claim must read "not reproduced"
    run["evals"]["ttt1"]["chain"]["alpha"] = [0.9] * 8
    results = tmp_path / "run.json"
    results.write_text(json.dumps(run))
    md = tmp_path / "results.md"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/tiny/report.py"), "--results", str(results), "--out", str(md)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    kept = json.loads(md.with_suffix(".json").read_text())
    assert (
        kept["settings"] == {"samples": 300, "eval_prompts": 16}
        and str(REPO) not in md.with_suffix(".json").read_text()
    )
    assert kept["commands"][0] == "eagle3 cache --out runs/bench/x"
    text = md.read_text()
    assert "τ 4.859 vs 9.000. Claim **not reproduced**." in text
    assert all(
        (tmp_path / f).read_bytes()[:4] == b"\x89PNG"
        for f in ("results-ttt.png", "results-fusion.png", "results-data.png")
    )
    check = subprocess.run([sys.executable, str(REPO / "benchmarks/tiny/report.py"), "--check", "--out", str(md)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stderr
    md.write_text(text.replace("9.000", "9.001"))
    check = subprocess.run([sys.executable, str(REPO / "benchmarks/tiny/report.py"), "--check", "--out", str(md)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 1 and "differs from" in check.stderr
