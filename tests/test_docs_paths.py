"""The docs point at things that exist.

Every repository file or folder that README.md or docs/*.md names (a path under one of the
project's top-level folders, with a file extension or a trailing '/') exists, and every
`tests/<file>.py::<name>` they cite names a function or class defined in that file. Not checked:
placeholders (`configs/experiment/NAME.yaml`, `<folder>/train/dataset.json`, globs, brace lists),
paths inside URLs, and paths written right after the word "upstream" (files of the upstream
repositories, e.g. upstream's models/layers.py). Pure text: no imports of the project, well under
a second.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOP = ("bench", "configs", "data", "docs", "launch", "models", "parity", "tests", "train")
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

_PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(TOP) + r")/(?:[\w.-]+/)*(?:[\w.-]+\.[A-Za-z]+|))"
    r"(::[A-Za-z_]\w*)?(?![\w/*{<-])"
)
_PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]*(\.|/|$)")  # NAME.yaml, RUN/, ...


def _references(text: str):
    for n, line in enumerate(text.splitlines(), 1):
        for m in _PATH.finditer(line):
            before = line[max(0, m.start() - 12) : m.start()].lower()
            if "upstream" in before or _PLACEHOLDER.search(m.group(1)):
                continue
            yield n, m.group(1), (m.group(2) or "")[2:]


def test_the_path_pattern_finds_what_it_should():
    line = (
        "see `train/trainer.py`, docs/data.md, `parity/trm_torch/` and "
        "`tests/test_aot.py::test_count_collectives_counts_ops_not_operand_references`; not "
        "`train/loss`, configs/experiment/NAME.yaml, `configs/model/*.yaml`, upstream's "
        "models/layers.py or https://github.com/karpathy/char-rnn/data/tinyshakespeare/input.txt"
    )
    assert [(p, s) for _, p, s in _references(line)] == [
        ("train/trainer.py", ""),
        ("docs/data.md", ""),
        ("parity/trm_torch/", ""),
        ("tests/test_aot.py", "test_count_collectives_counts_ops_not_operand_references"),
    ]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_paths_and_tests_named_in_the_docs_exist(doc):
    missing = []
    for n, rel, symbol in _references(doc.read_text(encoding="utf-8")):
        target = ROOT / rel
        if not target.exists():
            missing.append(f"{doc.name}:{n}: {rel} does not exist")
        elif symbol and target.suffix == ".py":
            src = target.read_text(encoding="utf-8")
            if not re.search(rf"^\s*(def|class)\s+{re.escape(symbol)}\b", src, re.M):
                missing.append(f"{doc.name}:{n}: {rel} defines no {symbol}")
    hint = (
        "\n(a path of another repository or inside a data set is not ours: write it right after "
        "the word 'upstream', as a URL, or below a placeholder such as <folder>/train/...)"
    )
    assert not missing, "\n".join(missing) + hint


# ------------------------------------------------------------------------- citations by title

SOURCES = sorted(
    p
    for p in [
        *ROOT.glob("*.md"),
        *(ROOT / "docs").glob("*.md"),
        *(p for top in TOP for p in (ROOT / top).glob("**/*.py")),
    ]
    if ".venv" not in p.parts
)
_CITATION = re.compile(r'docs/([\w-]+\.md),?\s+"([^"]{1,200})"')
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_ANCHOR = re.compile(r'<a\s+(?:id|name)="([^"]+)"')


def _norm(title: str) -> str:
    """Compared without backticks, case, a trailing period or a section number ("5. Traps")."""
    title = re.sub(r"^\d+(\.\d+)*\.?\s+", "", " ".join(title.replace("`", "").split()))
    return title.strip().rstrip(".:").lower()


def _titles(doc: pathlib.Path) -> set[str]:
    text = doc.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # no headings inside code blocks
    anchors = {_norm(a.replace("-", " ")) for a in _ANCHOR.findall(text)}
    return {_norm(h) for h in _HEADING.findall(text)} | anchors


def _citations(text: str):
    """(line, doc, title) for each `docs/<file>.md, "<title>"` (the comma is optional; a title may
    run onto the next line, as in a wrapped docstring or paragraph)."""
    for m in _CITATION.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)


def test_the_citation_pattern_finds_what_it_should():
    text = (
        'see docs/porting_trm.md, "The one-ulp envelope" and docs/training.md "Compilation\n'
        '    cache"; not docs/data.md alone or "a quote"'
    )
    assert [(d, _norm(t)) for _, d, t in _citations(text)] == [
        ("porting_trm.md", "the one-ulp envelope"),
        ("training.md", "compilation cache"),
    ]
    assert _norm("5. Traps") == _norm("`Traps`.") == "traps"


def test_every_titled_citation_names_a_heading_of_that_doc():
    """`docs/<file>.md, "<title>"` (in any .py or .md of the repository) names a heading (or an
    `<a id=...>` anchor) of that doc: traps and sections are cited by their stable names, so a
    renamed heading breaks here, not silently."""
    titles = {d.name: _titles(d) for d in (ROOT / "docs").glob("*.md")}
    bad = []
    for path in SOURCES:
        if path == pathlib.Path(__file__).resolve():  # its own examples
            continue
        for line, doc, title in _citations(path.read_text(encoding="utf-8")):
            if doc not in titles:
                bad.append(f"{path.relative_to(ROOT)}:{line}: docs/{doc} does not exist")
            elif _norm(title) not in titles[doc]:
                bad.append(f'{path.relative_to(ROOT)}:{line}: docs/{doc} has no heading "{title}"')
    assert not bad, "\n".join(bad)


_TRAP_NUMBER = re.compile(r"\btraps?\s+\d+\b", re.I)


def test_no_trap_is_cited_by_number():
    """Traps have stable names: a citation by number breaks silently when a list is
    reordered. Cite `docs/<file>.md, "<trap title>"` instead."""
    bad = []
    for path in SOURCES:
        rel = str(path.relative_to(ROOT))
        if rel == "tests/test_docs_paths.py":  # its own examples
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _TRAP_NUMBER.finditer(line):
                bad.append(f"{rel}:{n}: {m.group(0)!r}")
    assert not bad, "\n".join(bad)


# The docs whose first paragraph says what a reader gets from them, in at most five lines.
OPENING_CHECKED = [
    "architecture.md", "benchmarks.md", "data.md", "data_arc_maze_text.md", "evaluation.md",
    "index.md", "nanogpt_train_py.md", "parity.md", "training.md",
    "porting_nanogpt.md", "porting_trm.md", "porting_trm_training.md", "porting_your_model.md",
    "torch_to_jax.md",
]  # fmt: skip


@pytest.mark.parametrize("name", OPENING_CHECKED)
def test_each_doc_opens_with_what_it_gives_in_five_lines(name):
    lines = (ROOT / "docs" / name).read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{name}: the first line is its title"
    body = [i for i, line in enumerate(lines[1:], 1) if line.strip()]
    first = body[0]
    end = next((i for i in range(first, len(lines)) if not lines[i].strip()), len(lines))
    opening = lines[first:end]
    assert not opening[0].startswith(("#", "|", "```", "-", "*")), f"{name}: opens with prose"
    assert len(opening) <= 5, (
        f"{name}: the opening paragraph has {len(opening)} lines:\n" + "\n".join(opening)
    )


def test_quick_reference_rows_name_tests_that_exist():
    """docs/torch_to_jax.md names most tests bare (`test_...`): each is defined in
    tests/test_parity_torch_to_jax.py; path-qualified ones are checked above."""
    text = (ROOT / "docs" / "torch_to_jax.md").read_text(encoding="utf-8")
    src = (ROOT / "tests" / "test_parity_torch_to_jax.py").read_text(encoding="utf-8")
    bare = set(re.findall(r"(?<![:\w])`(test_\w+)`", text))
    assert bare, "the quick reference names no test"
    missing = sorted(n for n in bare if not re.search(rf"^def {n}\b", src, re.M))
    assert not missing, missing


# Backticked names in the docs that start with test_ but are no tests: fields of data sets.
NOT_TESTS = {"test_set_name2", "test_ids_in_other_subsets"}
_BARE_TEST = re.compile(r"(?<![:\w])`(test_\w+)(?:\[[^\]`]*\])?`")


def test_every_test_named_bare_in_the_docs_exists():
    """A test cited by its name alone (`test_...`, or `test_...[case]`) in README.md or docs/ is
    defined in some file under tests/: a renamed or removed test breaks its citations here."""
    src = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    defined = set(re.findall(r"^\s*def (test_\w+)", src, re.M))
    missing, cited = [], 0
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in _BARE_TEST.finditer(line):
                cited += 1
                if m.group(1) not in defined | NOT_TESTS:
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: {m.group(1)} is defined nowhere")
    assert cited > 100, cited  # the pattern finds the docs' citations
    assert not missing, "\n".join(missing)
