"""A clone works like the checkout that wrote it: no committed file names the writer's folders, an
export records paths relative to the repository, a committed head whose target a clone has not
built says `make smollm2`, and eval and export never replace a finished output made otherwise."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from head_fixtures import make_head

from eagle3cli.cli import main
from eagle3cli.eval.run import default_out

REPO = Path(__file__).resolve().parents[2]
PUBLISHED_HEAD = REPO / "models" / "smollm2-135m-eagle3"
# an absolute path of some machine: /work/..., /home/..., /root/..., /tmp/..., /Users/..., /mnt/...
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|tmp|Users|mnt|scratch|data)/[\w.-]")


def _committed(*folders: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", *folders], cwd=REPO, capture_output=True, text=True, check=True)
        return [REPO / f for f in out.stdout.split()]
    except (OSError, subprocess.CalledProcessError):  # an export of the tree without git
        return [p for f in folders for p in (REPO / f).rglob("*") if p.is_file()]


def test_no_committed_file_names_a_folder_of_the_machine_that_wrote_it():
    found = []
    for path in _committed("models", "docs", "recipes"):
        data = path.read_bytes()[:2_000_000]
        if b"\0" in data[:8192]:  # weights, plots
            continue
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not found, "absolute paths of a machine in committed files:\n" + "\n".join(found)


def test_the_pattern_finds_what_it_must():
    for bad in ('"path": "/work/main/models/x"', "--run /home/me/runs/a", "x=/tmp/pytest-1/a"):
        assert MACHINE_PATH.search(bad), bad
    for fine in ("models/smollm2-135m", "see /proc/cpuinfo", "https://github.com/x/work/y", "~/tmp/x"):
        assert not MACHINE_PATH.search(fine), fine


def test_the_published_head_records_its_target_relative_to_the_repository():
    cfg = json.loads((PUBLISHED_HEAD / "config.json").read_text())
    manifest = json.loads((PUBLISHED_HEAD / "manifest.json").read_text())
    assert cfg["eagle3"]["target"]["path"] == manifest["target"]["path"] == "models/smollm2-135m"


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A clone without models/smollm2-135m (git-ignored: `make smollm2` builds it), as the cwd."""
    head = tmp_path / "models" / "smollm2-135m-eagle3"
    head.mkdir(parents=True)
    for name in ("config.json", "manifest.json"):  # the target is named before any weight is read
        shutil.copy(PUBLISHED_HEAD / name, head / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_eval_of_the_published_head_without_its_target_says_make_smollm2(clone, capsys):
    before = sorted(p.relative_to(clone) for p in clone.rglob("*"))
    args = ["eval", "--head", "models/smollm2-135m-eagle3", "--bench", "mt_bench", "--num-prompts", "2"]
    assert main([*args, "--depth", "1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error:" in err and "models/smollm2-135m" in err and "next: make smollm2" in err
    assert sorted(p.relative_to(clone) for p in clone.rglob("*")) == before  # nothing written, in models/ or not
    # an explicit --target that `make smollm2` builds gets the same hint
    assert main([*args, "--target", "models/smollm2-135m"]) == 2
    assert "next: make smollm2" in " ".join(capsys.readouterr().err.split())


def test_eval_of_a_head_folder_writes_outside_models():
    assert default_out(None, Path("models/smollm2-135m-eagle3")) == Path("runs/eval-smollm2-135m-eagle3")
    assert default_out(None, Path("runs/a/head")) == Path("runs/a/eval")
    assert default_out(Path("runs/b"), Path("runs/b/head")) == Path("runs/b/eval")


def test_export_records_paths_relative_to_the_repository(tiny_target_dir, tmp_path_factory, monkeypatch):
    head = make_head(tiny_target_dir, tmp_path_factory.mktemp("rel") / "run" / "head")
    monkeypatch.chdir(Path(tmp_path_factory.getbasetemp()))  # holds the target and the head: "the repository"
    out = Path("exported")
    assert main(["export", "--head", str(head), "--format", "sglang", "--out", str(out)]) == 0
    cfg, manifest = (json.loads((out / n).read_text()) for n in ("config.json", "manifest.json"))
    base = str(Path(tmp_path_factory.getbasetemp()).resolve())
    target = cfg["eagle3"]["target"]["path"]
    assert not Path(target).is_absolute() and (Path(target) / "config.json").is_file()
    assert not Path(manifest["source"]).is_absolute() and manifest["target"]["path"] == target
    for name in ("config.json", "manifest.json"):
        assert base not in (out / name).read_text(), name


def _eval_args(target: Path, head: Path, out: Path, *more: str) -> list[str]:
    args = ["eval", "--target", str(target), "--head", str(head), "--bench", "gsm8k", "--num-prompts", "1"]
    return [*args, "--max-new-tokens", "4", "--no-generate-baseline", "--out", str(out), *more]


def test_eval_does_not_silently_replace_a_finished_report_made_otherwise(tiny_target_dir, tmp_path, capsys):
    head = make_head(tiny_target_dir, tmp_path / "run" / "head")
    out = tmp_path / "run" / "eval"
    assert main(_eval_args(tiny_target_dir, head, out, "--depth", "3", "--mode", "both")) == 0
    report = (out / "report.json").read_bytes()
    capsys.readouterr()
    assert main(_eval_args(tiny_target_dir, head, out, "--depth", "2")) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds a finished `eagle3 eval` made with other settings" in err
    assert "depth: 3 there, 2 now" in err and "mode: 'both' there, 'chain' now" in err
    assert "--overwrite" in err and "--out NEW_FOLDER" in err
    assert (out / "report.json").read_bytes() == report  # untouched
    # the same command again reruns; --overwrite replaces
    assert main(_eval_args(tiny_target_dir, head, out, "--depth", "3", "--mode", "both", "--threads", "1")) == 0
    assert main(_eval_args(tiny_target_dir, head, out, "--depth", "2", "--overwrite")) == 0
    assert json.loads((out / "report.json").read_text())["depth"] == 2


def test_export_over_another_export_needs_overwrite(tiny_target_dir, tmp_path, capsys):
    a = make_head(tiny_target_dir, tmp_path / "a" / "head")
    b = make_head(tiny_target_dir, tmp_path / "b" / "head", seed=1)
    out = tmp_path / "exported"
    assert main(["export", "--head", str(a), "--out", str(out)]) == 0
    weights = (out / "model.safetensors").read_bytes()
    assert main(["export", "--head", str(a), "--out", str(out)]) == 0  # the same export again
    capsys.readouterr()
    assert main(["export", "--head", str(b), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds a finished `eagle3 export` made with other settings" in err and "head:" in err
    assert "--overwrite" in err and (out / "model.safetensors").read_bytes() == weights
    assert main(["export", "--head", str(a), "--out", str(out), "--dtype", "bf16"]) == 2
    assert main(["export", "--head", str(b), "--out", str(out), "--overwrite"]) == 0
    assert (out / "model.safetensors").read_bytes() != weights


def test_readme_and_quickstart_give_the_same_chain_on_your_own_model():
    def chain(page: str) -> list[str]:
        text = (REPO / page).read_text()
        block = text.split("```bash\neagle3 gen-data --recipe recipes/llama3-8b/", 1)[1].split("```", 1)[0]
        return [
            " ".join(ln.split("#")[0].split())
            for ln in ("eagle3 gen-data --recipe recipes/llama3-8b/" + block).splitlines()
            if ln.strip()
        ]

    readme = chain("README.md")
    assert readme == chain("docs/quickstart.md")
    assert [ln.split()[1] for ln in readme] == ["gen-data", "cache", "train", "eval", "serve"]
    assert all((REPO / p).exists() for ln in readme for p in re.findall(r"recipes/\S+", ln))
