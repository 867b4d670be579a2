"""Every fenced code block in README.md and docs/*.md runs, or is marked as not run.

The rule (docs/README.md says the same for writers):

- A block whose info string is ``python`` runs. The Python blocks of one page
  run in order in one namespace, like the cells of a notebook, with the
  current directory a fresh temporary one and three names defined: ``drt``
  (datasetrt), ``pl`` (polars) and ``ds``, a dataset of 200 samples built
  there whose metadata are ``label`` (0-9), ``split`` ("train" or "val") and
  ``quality`` (0.0-0.99), as ``tests/conftest.py``'s ``Source`` makes them.
- ``python illustrative`` marks a Python block that is shown, not run: it
  needs torch workers, Ray, a bucket, a training step of yours or minutes.
  It must still compile.
- Any other language (``bash``, ``sh``, ``console``, ``text`` for diagrams
  and output, ``ipython`` for notebook cells, ``sql``...) is not run: the
  language is the mark.
- A block without an info string fails here: say what it is.

Every page runs under a hard timeout (pytest-timeout), and the whole file
takes a few seconds. Links between the pages are checked too: every relative
link points to a file that exists, and every page under ``docs/`` is linked
from the README. And the Layout in docs/ARCHITECTURE.md is exact: it names
every top-level entry, Rust source file and package module, and each
module's brackets are exactly its run-time imports from the package.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
#: Languages that are never run, and need no other mark.
NOT_RUN = {"bash", "sh", "shell", "console", "text", "ipython", "sql", "rust", "toml", "json"}


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    end: int  # of the closing fence
    info: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info else ""

    @property
    def runs(self) -> bool:
        return self.language == "python" and "illustrative" not in self.info.split()[1:]


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, dedented by their fence's indent."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        assert j < len(lines), f"{page.name}:{i + 1}: the code block is never closed"
        out.append(Block(page, i + 1, j + 1, opening["info"].strip(), "\n".join(body) + "\n"))
        i = j + 1
    return out


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_says_what_it_is(page):
    unmarked = [b.where for b in blocks(page) if not b.language]
    assert not unmarked, (
        f"code blocks without an info string: {unmarked}; write `python` (it runs), "
        f"`python illustrative` (shown, not run) or the language (`bash`, `text`...)"
    )
    unknown = [
        f"{b.where} ({b.info})" for b in blocks(page) if b.language not in NOT_RUN | {"python"}
    ]
    assert not unknown, f"teach tests/test_docs.py these languages: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_illustrative_python_compiles(page):
    for block in blocks(page):
        if block.language == "python" and not block.runs:
            compile(block.code, block.where, "exec")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.runs for b in blocks(p))], ids=page_id)
def test_the_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {
        "__name__": "__docs__",
        "drt": drt,
        "pl": pl,
        "ds": drt.build(tmp_path / "data", [Source("items-v1", 200)], progress=False),
    }
    for block in (b for b in blocks(page) if b.runs):
        started = time.monotonic()
        try:
            exec(compile(block.code, block.where, "exec"), namespace)
        except Exception as e:
            raise AssertionError(
                f"{block.where}: the block fails ({type(e).__name__}: {e}); fix it, or mark "
                f"it `python illustrative` if it cannot run here"
            ) from e
        assert time.monotonic() - started < 10, f"{block.where}: a block takes seconds"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_links_between_pages_resolve(page):
    lines = page.read_text().splitlines()
    for code in blocks(page):  # links inside code blocks are code
        lines[code.line - 1 : code.end] = [""] * (code.end - code.line + 1)
    text = "\n".join(lines)
    broken = [
        m["target"]
        for m in LINK.finditer(text)
        if "://" not in m["target"]
        and not m["target"].startswith(("#", "mailto:"))
        and not (page.parent / m["target"].split("#")[0]).exists()
    ]
    assert not broken, f"{page_id(page)} links to what does not exist: {broken}"


def test_the_readme_links_every_page():
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / m["target"].split("#")[0]).resolve() for m in LINK.finditer(readme)}
    missing = [page_id(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"the README does not link {missing}"


def layout() -> str:
    """The Layout picture of docs/ARCHITECTURE.md: the first ``text`` block
    after ``## Layout``."""
    page = ROOT / "docs" / "ARCHITECTURE.md"
    start = page.read_text().splitlines().index("## Layout") + 1
    return next(b.code for b in blocks(page) if b.line > start and b.language == "text")


def test_the_layout_names_every_source_file():
    """The Layout is exact: every top-level entry, every Rust source file
    (``mod.rs`` aside), every binding file and every module of the package
    (its subpackage ``sources/``'s too)."""
    picture = layout()
    tracked = [
        *(p for p in ROOT.iterdir() if p.name in {".ci"} or not p.name.startswith(".")),
        *(ROOT / "engine" / "src").rglob("*.rs"),
        *(ROOT / "engine" / "tests" / "it").glob("*.rs"),
        *(ROOT / "python" / "src").glob("*.rs"),
        *(ROOT / "python" / "datasetrt").rglob("*.py"),
        *(
            p
            for p in (ROOT / "tests").iterdir()
            if p.is_dir() and not p.name.startswith((".", "_"))
        ),
    ]
    ignored = {"target", "mod.rs", "main.rs", "Cargo.lock"}  # build output; module lists
    names = {p.stem if p.parent.name == "it" else p.name for p in tracked if p.name not in ignored}
    missing = sorted(n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}\b", picture))
    assert not missing, f"the Layout (docs/ARCHITECTURE.md) does not name {missing}"


def test_the_layout_brackets_are_the_imports():
    """Each module's brackets in the Layout list exactly what it imports from
    the package at run time (as tests/test_wrapper_coverage.py reads them).
    A subpackage's entry (``sources/``) is its ``__init__.py``, and the
    files indented under it its other modules, whose brackets name its
    modules by their file's name (``_common``: ``sources._common``)."""
    from test_wrapper_coverage import PACKAGE, import_graph

    graph = import_graph(PACKAGE)
    known = graph.keys() | set().union(*graph.values())
    picture = layout().split("python/datasetrt/", 1)[1].split("\nsql/", 1)[0]
    entries = []  # (module, subpackage or "", the entry's text)
    for entry in re.split(r"\n  (?=[\w.]+(?:\.py|/)\s)", "\n" + picture)[1:]:
        name = entry.split()[0]
        if not name.endswith("/"):
            entries.append((name.removesuffix(".py"), "", entry))
            continue
        sub = name.removesuffix("/")
        own, *files = re.split(r"\n    (?=[\w.]+\.py\s)", entry)
        entries.append((sub, sub, own))
        entries += [(f"{sub}.{f.split()[0].removesuffix('.py')}", sub, f) for f in files]
    listed: dict[str, set[str]] = {}
    for name, sub, entry in entries:
        brackets = re.findall(r"\[([^\]]*)\]", entry)
        words = set(re.findall(r"\w+", " ".join(brackets)))
        words = {f"{sub}.{w}" if f"{sub}.{w}" in known else w for w in words}
        listed[name] = words & known
    wrong = {
        m: {"Layout": sorted(listed.get(m, ())), "imports": sorted(deps)}
        for m, deps in graph.items()
        if m != "__main__" and listed.get(m) != deps
    }
    assert not wrong, f"the Layout's brackets differ from the imports: {wrong}"
