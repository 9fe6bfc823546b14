"""The trainer replaces only what a builder built, and never trains silently on a data set built
from other settings (data/provenance.py, train.task.build_data): one table of folder states x what
the run's config builds -> read it, build, rebuild (a warning names what differed) or refuse in
one line with everything kept."""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request

import pytest

from data import provenance
from tests.helpers import snapshot, synthetic_text
from train.errors import ConfigError

ARGS = ["train=6", "test=4", "blanks=8", "num_aug=0"]


def _trm(path, args=ARGS):
    return {"path": str(path), "build": "sudoku_easy", "build_args": list(args)}


def _built(path, args=ARGS):
    """`path` as the trainer's data.build leaves it (a build record)."""
    from train.families.trm.data import prepare_data

    prepare_data(_trm(path, args))


def _unrecorded(path):
    from data.sudoku_easy import build_easy_sudoku

    build_easy_sudoku(str(path), train=6, test=4, blanks=8, num_aug=0)


def _test_only(path):
    from data.sudoku_easy import build_easy_sudoku

    build_easy_sudoku(str(path), train=0, test=4, blanks=8, num_aug=0)


def _with_notes(make):
    def setup(path):
        make(path)
        (path / "NOTES.md").write_text("my notes")

    return setup


def _without_test_split(path):
    _built(path)
    for f in (path / "test").iterdir():
        f.unlink()
    (path / "test").rmdir()


def _file(path):
    path.write_text("not a folder")


# (what is at data.path, the run's build_args) -> "use" | "build" | "rebuild" | refused: its words
CASES = [
    ("nothing", None, ARGS, "build"),
    ("an empty folder", lambda p: p.mkdir(), ARGS, "build"),
    ("its own build", _built, ARGS, "use"),
    ("its build with other arguments", _built, ["train=6", "test=4", "blanks=9", "num_aug=0"],
     "rebuild"),
    ("a complete data set without a record", _unrecorded, ARGS, "use"),
    ("a test split alone beside a user's notes", _with_notes(_test_only), ARGS,
     "holds NOTES.md, identifiers.json, test but no complete data set and no built_by.json"),
    ("its build beside a user's notes", _with_notes(_built), ARGS,
     "holds NOTES.md, which its build did not write"),
    ("its build, a split gone", _without_test_split, ARGS, "lacks test, which its build wrote"),
    ("a file", _file, ARGS, "is a file, not a data set folder"),
]  # fmt: skip


@pytest.mark.parametrize("what, setup, args, outcome", CASES, ids=[c[0] for c in CASES])
def test_the_trainer_replaces_only_what_a_builder_built(tmp_path, caplog, what, setup, args,
                                                        outcome):  # fmt: skip
    from train.families.trm.data import prepare_data

    path = tmp_path / "data"
    if setup is not None:
        setup(path)
    before = snapshot(str(tmp_path))
    record = json.loads((path / "built_by.json").read_text()) if (path / "built_by.json").exists() else None  # fmt: skip
    caplog.set_level(logging.INFO)
    if outcome in ("build", "use", "rebuild"):
        prepare_data(_trm(path, args))
        now = snapshot(str(tmp_path))
        if outcome == "use":
            assert now == before  # read as it is
        else:
            rec = json.loads((path / "built_by.json").read_text())
            assert rec["args"] == list(args) and rec["builder"] == "data.sudoku_easy"
            assert sorted(rec["files"]) == sorted(os.listdir(path))
        if outcome == "rebuild":
            assert record["args"] != rec["args"]
            assert "built with args" in caplog.text and "blanks=8" in caplog.text, caplog.text
            assert "rebuilding it as data.build=sudoku_easy" in caplog.text
        if what == "a complete data set without a record":  # said, not silent
            assert "no built_by.json says how it was built: read as it is" in caplog.text
    else:
        with pytest.raises(ConfigError) as e:
            prepare_data(_trm(path, args))
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"data.path='{path}' (data.build=sudoku_easy")
        assert outcome in line, line
        assert snapshot(str(tmp_path)) == before  # nothing removed, moved or added


def _offline(*args, **kwargs):
    raise urllib.error.URLError("offline")


def test_a_text_set_built_from_another_input_is_rebuilt_or_refused_in_one_line(
    tmp_path, monkeypatch, caplog
):
    """gpt_shakespeare_char with data.input=FILE builds data.path; a later run naming no input
    (tiny-shakespeare's download) does not train on FILE's text: it rebuilds, and offline that
    is one line naming what the folder was built from; FILE's set stays. With the same FILE again
    the set is read as it is; with another file of other text it is rebuilt from that."""
    from train.families.gpt.data import prepare_data

    mine, other = tmp_path / "mine.txt", tmp_path / "other.txt"
    mine.write_text(synthetic_text(20_000, seed=1))
    other.write_text(synthetic_text(20_000, seed=2))
    path = tmp_path / "shakespeare_char"
    d = {"path": str(path), "build": "shakespeare_char", "input": str(mine)}
    prepare_data(d)
    built = snapshot(str(path))
    prepare_data(d)
    assert snapshot(str(path)) == built
    monkeypatch.setattr(urllib.request, "urlopen", _offline)
    caplog.set_level(logging.WARNING)
    with pytest.raises(ConfigError) as e:
        prepare_data({**d, "input": ""})
    assert "could not download" in str(e.value) and "\n" not in str(e.value)
    assert "built with input a file of SHA-256" in caplog.text, caplog.text
    assert "(this run: downloaded from https://" in caplog.text
    assert snapshot(str(path)) == built
    prepare_data({**d, "input": str(other)})
    rec = json.loads((path / "built_by.json").read_text())
    assert rec["inputs"]["input"] == provenance.identity(str(other))
