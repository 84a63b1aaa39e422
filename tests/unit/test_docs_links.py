"""Every link between the user's pages resolves: the file exists and, for `page.md#anchor`, a heading
of that page makes that anchor (GitHub's rule), so moving a section between pages cannot leave a
dangling link behind."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but `-` and `_` dropped, spaces to `-`; repeats get -1, -2."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[tuple[str, str]]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [(m[0], m[1]) for m in re.findall(r"\]\(([^)\s#]*\.md|)(?:#([^)\s]+))?\)", text) if m[0] or m[1]]


def test_every_link_between_pages_reaches_a_page_and_a_heading():
    bad = []
    for page in PAGES:
        for target, anchor in links(page):
            dest = page if not target else (page.parent / target).resolve()
            if not dest.exists():
                bad.append(f"{page.name}: {target} does not exist")
            elif anchor and anchor not in anchors(dest):
                bad.append(f"{page.name}: {target}#{anchor} names no heading of {dest.name}")
    assert bad == []


def test_the_anchor_rule_matches_githubs():
    page = REPO / "docs" / "results-smollm2.md"
    assert "eval---sweep-on-mt-bench-measured-speed-of-each-configuration" in anchors(page)
    assert "engines-the-head-in-vllm-and-llamacpp" in anchors(page)


def _code(x) -> str:
    if x is None:
        return "-"
    return ", ".join(f"`{p}`" for p in x) if isinstance(x, tuple) else f"`{x}`"


def test_the_head_format_page_shows_every_field_and_tensor_as_head_table_has_them():
    """docs/export.md's two tables are head/table.py's rows: a field added there and not here fails."""
    from eagle3cli.head.table import FIELDS, TENSORS

    page = (REPO / "docs" / "export.md").read_text(encoding="utf-8")
    for f in FIELDS:
        cells = (f"`{f.name}`", _code(f.eagle3), _code(f.speculators), _code(f.sglang), _code(f.vllm), _code(f.gguf))
        assert "| " + " | ".join(cells) + f" | {f.value} |" in page, f.name
    for t in TENSORS:
        assert f"| `{t.name}` | {_code(t.gguf)} | {t.shape} | {t.present} |" in page, t.name
    rows = [ln for ln in page.splitlines() if ln.startswith("| `")]
    assert len(rows) == len(FIELDS) + len(TENSORS)  # no row the table no longer has
