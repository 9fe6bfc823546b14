"""docs/testing.md's "What the slow tier proves" lists every slow test function and no other: the
slow tests are found by reading tests/ with `ast` (no pytest collection, no imports)."""

from __future__ import annotations

import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
DOC = TESTS.parent / "docs" / "testing.md"
SECTION = "## What the slow tier proves"


def _is_slow_mark(node: ast.AST) -> bool:
    """`pytest.mark.slow` (or `mark.slow`), bare or inside a call, a list or a `pytest.param`."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "slow"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    )


def _mentions_slow(node: ast.AST, module_names: dict[str, ast.AST], seen: set[str]) -> bool:
    """A slow mark anywhere in `node`, following names bound at module level (a parametrize list
    such as `CASES = [pytest.param(..., marks=pytest.mark.slow)]`)."""
    for n in ast.walk(node):
        if _is_slow_mark(n):
            return True
        if isinstance(n, ast.Name) and n.id in module_names and n.id not in seen:
            seen.add(n.id)
            if _mentions_slow(module_names[n.id], module_names, seen):
                return True
    return False


def _module_names(tree: ast.Module) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for st in tree.body:
        if isinstance(st, ast.Assign):
            names.update((t.id, st.value) for t in st.targets if isinstance(t, ast.Name))
        elif isinstance(st, ast.AnnAssign) and st.value and isinstance(st.target, ast.Name):
            names[st.target.id] = st.value
    return names


def _test_functions(tree: ast.Module):
    """(name, decorators of it and of its class) of each test function, in a `Test*` class too."""
    for st in tree.body:
        if isinstance(st, ast.FunctionDef) and st.name.startswith("test"):
            yield st.name, st.decorator_list
        elif isinstance(st, ast.ClassDef) and st.name.startswith("Test"):
            for fn in st.body:
                if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
                    yield f"{st.name}::{fn.name}", st.decorator_list + fn.decorator_list


def slow_tests(tests_dir: pathlib.Path = TESTS) -> set[str]:
    """`file::function` of every test function with a slow mark: its decorators (a slow case of
    its parametrization counts) or its module's `pytestmark`."""
    found = set()
    for path in sorted(tests_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _module_names(tree)
        module_slow = "pytestmark" in names and _mentions_slow(names["pytestmark"], {}, set())
        for name, decorators in _test_functions(tree):
            if module_slow or any(_mentions_slow(d, names, set()) for d in decorators):
                found.add(f"{path.name}::{name}")
    return found


def documented(doc: pathlib.Path = DOC) -> list[str]:
    """The `file::function` of each table row in the section, in order."""
    text = doc.read_text(encoding="utf-8")
    assert SECTION in text, f"{doc} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    body = re.split(r"^## ", body, maxsplit=1, flags=re.M)[0]
    return re.findall(r"^\| `(test_\w+\.py::[\w:]+)` \|", body, flags=re.M)


def test_the_docs_list_every_slow_test_and_no_other():
    slow, rows = slow_tests(), documented()
    assert len(slow) > 50, sorted(slow)  # the AST scan finds the slow tier
    repeated = sorted({r for r in rows if rows.count(r) > 1})
    missing = sorted(slow - set(rows))
    extra = sorted(set(rows) - slow)
    assert not missing, f"slow tests without a row in {DOC.name}, {SECTION!r}: {missing}"
    assert not extra, f"rows in {DOC.name}, {SECTION!r} naming no slow test: {extra}"
    assert not repeated, f"rows listed twice: {repeated}"


def test_the_scan_sees_each_way_a_test_is_marked_slow(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "import pytest\n"
        "CASES = [1, pytest.param(2, marks=pytest.mark.slow)]\n"
        "@pytest.mark.slow\ndef test_decorated(): pass\n"
        "@pytest.mark.parametrize('x', CASES)\ndef test_case_by_name(x): pass\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=[pytest.mark.slow] if 1 else [])])\n"
        "def test_case_inline(x): pass\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_fast(x): pass\n"
        "def helper_slow(): pass\n"
    )
    (tmp_path / "test_b.py").write_text(
        "import pytest\npytestmark = [pytest.mark.slow]\ndef test_in_a_slow_module(): pass\n"
    )
    (tmp_path / "test_c.py").write_text(
        "import pytest\n@pytest.mark.slow\nclass TestGroup:\n    def test_in_a_class(self): pass\n"
    )
    (tmp_path / "helpers.py").write_text("import pytest\n@pytest.mark.slow\ndef test_x(): pass\n")
    assert slow_tests(tmp_path) == {
        "test_a.py::test_decorated",
        "test_a.py::test_case_by_name",
        "test_a.py::test_case_inline",
        "test_b.py::test_in_a_slow_module",
        "test_c.py::TestGroup::test_in_a_class",
    }
