"""The data builders' command lines (`python -m data.<builder>`, data/cli.py `run`): an input a
user can fix (a missing file, a bad key=value) ends in one line `error: ...` naming it, exit
status 1, no traceback; HYDRA_FULL_ERROR=1 gives the traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO


def _run(args: list[str], cwd, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, full.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


# (arguments, what the one line names); {tmp} is the test's folder
CASES = [
    (["data.shakespeare_char", "--input", "{tmp}/input.txt", "--out-dir", "{tmp}/out"],
     "No such file or directory: '{tmp}/input.txt'"),
    (["data.maze", "--source", "{tmp}/maze", "--out-dir", "{tmp}/out"],
     "{tmp}/maze: expected train.csv + test.csv"),
    (["data.arc", "--input-file-prefix", "{tmp}/arc", "--output-dir", "{tmp}/out"],
     "{tmp}/arc_training_challenges.json not found"),
    (["data.sudoku_easy", "--output-dir", "{tmp}/out", "train=ten", "test=1", "blanks=30",
      "num_aug=0"], "'train=ten': train must be a whole number"),
    (["data.sudoku", "--generate", "5", "--output-dir", "{tmp}/taken", "--overwrite"],
     "{tmp}/taken holds 1 entries but no data set"),
    (["data.openwebtext", "--input", "{tmp}/docs.txt", "--encoding", "bytes", "--out-dir",
      "{tmp}/out"], "input {tmp}/docs.txt does not exist"),
]  # fmt: skip


@pytest.mark.parametrize("args, names", CASES, ids=[c[0][0] for c in CASES])
def test_a_bad_input_is_one_line_naming_it(tmp_path, args, names):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    args = [a.format(tmp=tmp_path) for a in args]
    proc = _run(args, tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert names.format(tmp=tmp_path) in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_hydra_full_error_gives_the_traceback(tmp_path):
    args = ["data.maze", "--source", str(tmp_path / "maze"), "--out-dir", str(tmp_path / "out")]
    proc = _run(args, tmp_path, HYDRA_FULL_ERROR="1")
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr[-2000:]
    assert "FileNotFoundError" in proc.stderr
