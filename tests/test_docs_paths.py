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
