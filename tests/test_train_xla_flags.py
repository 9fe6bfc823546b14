"""run.xla_flags (train/xla_flags.py): the config's XLA flags reach XLA in `python -m train.main`,
the environment's own XLA_FLAGS win a repeated flag, and bad values are one line before any work.

XLA reads XLA_FLAGS once per process, so every run here is a fresh subprocess; what XLA did with
the flags is SEEN in what it writes (--xla_dump_to's files), not inferred from the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, build_tiny_sudoku, tiny_trm_overrides, without_session_cache
from train import xla_flags
from train.compose import load_config
from train.errors import ConfigError


def test_parse_keeps_flags_and_names_a_word_that_is_none():
    assert xla_flags.parse("  --xla_a=1   --xla_b ") == "--xla_a=1 --xla_b"
    assert xla_flags.parse(None) == xla_flags.parse("") == ""
    with pytest.raises(ConfigError, match=r"run.xla_flags: 'xla_a=1' is not an XLA flag"):
        xla_flags.parse("--xla_b xla_a=1")


def test_the_environments_flags_come_last_so_they_win_a_repeat():
    assert xla_flags.merged("--a=1 --b=2", "--a=3") == "--a=1 --b=2 --a=3"
    assert xla_flags.merged("", None) == "" and xla_flags.merged("--a=1", "") == "--a=1"


def test_a_bad_value_is_one_config_error_while_composing():
    with pytest.raises(ConfigError, match=r"^run.xla_flags: 'triton' is not an XLA flag"):
        load_config(["+experiment=trm_sudoku_tiny", "run.xla_flags=triton"])


def test_trm_sudoku_turns_triton_gemm_off_and_the_flag_parses_on_this_cpu():
    """The experiment's default (docs/benchmarks.md, "Results on a GPU") is an XLA:GPU
    flag: on a CPU it must parse and change nothing, or trm_sudoku could not start here (XLA
    aborts a process on a flag it does not know)."""
    flags = load_config(["+experiment=trm_sudoku"]).run.xla_flags
    assert flags == "--xla_gpu_enable_triton_gemm=false"
    code = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda x: 2 * x)(jnp.ones(()))))"
    env = {**os.environ, "XLA_FLAGS": xla_flags.merged(flags, os.environ.get("XLA_FLAGS"))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "2.0", done.stderr[-2000:]


def test_config_flags_reach_xla_and_the_environments_win_a_repeat(tmp_path):
    """One tiny TRM run of `python -m train.main`: the config dumps only the train step's HLO
    (--xla_dump_hlo_module_re) to A, the shell's XLA_FLAGS dumps to B. XLA wrote the train step's
    HLO, and no other program's, to B, and nothing to A: the config's flags were read (the filter
    held) and the shell's repeat of --xla_dump_to won. No compilation cache: every program is
    compiled (init, eval and small helpers besides the train step)."""
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    a, b = tmp_path / "dump_a", tmp_path / "dump_b"
    cmd = [sys.executable, "-m", "train.main"]
    cmd += tiny_trm_overrides(data, str(tmp_path / "runs"), "flags", epochs=1)
    # Hydra's grammar: a value with spaces is quoted (the shell: "run.xla_flags='--a=1 --b=2'")
    cmd += [f"run.xla_flags='--xla_dump_to={a} --xla_dump_hlo_module_re=.*train_step.*'"]
    env = without_session_cache()
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={b}".strip()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not a.exists(), sorted(os.listdir(a))
    # each dumped program's HLO before XLA's passes (the CPU backend also leaves one folder per
    # program, which the filter does not cover)
    hlo = {f.split(".")[1] for f in os.listdir(b) if f.endswith(".before_optimizations.txt")}
    assert hlo == {"jit_train_step"}, sorted(os.listdir(b))


def test_a_sweep_whose_jobs_differ_in_xla_flags_is_one_line_before_any_job(tmp_path):
    """A -m sweep's jobs share one process, which reads XLA flags once. (A value with `=` is
    quoted for Hydra's grammar, on the command line too: run.xla_flags='--name=value'.)"""
    cmd = [sys.executable, "-m", "train.main", "-m", "+experiment=trm_sudoku_tiny",
           f"run.out_dir={tmp_path}", "run.xla_flags='--xla_a=1','--xla_a=2'"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: sweep job 1 (+experiment=trm_sudoku_tiny run.out_dir="
        f"{tmp_path} run.xla_flags='--xla_a=2'): run.xla_flags: this process started XLA with "
        "'--xla_a=1'; XLA reads its flags once per process, so '--xla_a=2' needs a process of "
        "its own"
    ], done.stderr
    assert not os.listdir(tmp_path)
