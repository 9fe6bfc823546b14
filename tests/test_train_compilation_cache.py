"""The persistent XLA compilation cache of `python -m train.main` (train/compilation_cache.py).

Every test that turns the cache on runs in a fresh subprocess: JAX opens its cache once per process
and the setting is process-wide, so doing it inside the pytest worker would leak into every later
test there. Hits are COUNTED (jax.monitoring events), never timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from parity.compare import EXACT, assert_close
from tests.helpers import (
    REPO,
    build_tiny_sudoku,
    compilation_cache_counts,
    losses,
    tiny_trm_overrides,
    without_session_cache,
)
from train.compilation_cache import DEFAULT_DIR, resolve_dir
from train.compose import load_config
from train.errors import ConfigError


def _entries(cache_dir) -> list[str]:
    """Cache entries JAX wrote (one `<module>-<hash>-cache` file per program)."""
    if not os.path.isdir(cache_dir):
        return []
    return sorted(f for f in os.listdir(cache_dir) if f.endswith("-cache"))


@pytest.mark.slow  # two TRM runs; the default tier checks on / off / the user's dir
def test_second_process_loads_every_program_from_the_cache_and_trains_the_same(tmp_path):
    """Two fresh `python -m train.main` processes, same tiny TRM run, one cache dir: the first
    compiles and writes every program; the second compiles NOTHING (every program is a cache hit:
    init, train step, eval) and its losses and eval metrics are bit-identical (EXACT): a loaded
    executable computes what the compiled one did.

    min_compile_secs=0 so every program is written, which makes "all hits" the exact expectation."""
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    out, cache = str(tmp_path / "runs"), str(tmp_path / "xla_cache")

    def run(name):
        cmd = [sys.executable, "-m", "train.main"]
        cmd += tiny_trm_overrides(data, out, name, epochs=1, cache_dir=cache)
        cmd += ["run.compilation_cache_min_compile_secs=0"]  # 1 epoch = 2 steps, then eval
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                              env=without_session_cache())  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"XLA compilation cache: {cache} " in done.stderr, done.stderr[-2000:]
        return compilation_cache_counts(done.stderr)

    cold = run("cold")
    assert cold["hits"] == 0 and cold["writes"] > 0, cold
    assert len(_entries(cache)) == cold["writes"], (_entries(cache), cold)
    assert any(f.startswith("jit_train_step-") for f in _entries(cache)), _entries(cache)
    warm = run("warm")
    assert warm["requests"] > 0 and warm["hits"] == warm["requests"], warm
    assert warm["writes"] == 0 and len(_entries(cache)) == cold["writes"], warm

    for key in ("train/lm_loss", "train/q_halt_loss", "train/accuracy"):
        a, b = losses(os.path.join(out, "cold"), key), losses(os.path.join(out, "warm"), key)
        assert sorted(a) == sorted(b) == [1, 2], (a, b)
        assert_close(f"{key} warm vs cold cache", [b[s] for s in a], [a[s] for s in a], EXACT)
    finals = [json.load(open(os.path.join(out, n, "final.json"))) for n in ("cold", "warm")]
    evals = sorted(k for k in finals[0] if k.startswith("eval/"))
    assert evals, finals[0]
    assert_close(
        "final eval metrics warm vs cold cache",
        [finals[1][k] for k in evals],
        [finals[0][k] for k in evals],
        EXACT,
    )


# One process: compose the config as train.main does, call the setup train.main calls, compile one
# real program, print what JAX ended up with.
_PROBE = """
import logging, sys
import jax, jax.numpy as jnp
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from train.compilation_cache import compilation_cache_stats, setup_compilation_cache
from train.compose import load_config
cfg = load_config(sys.argv[1:])
used = setup_compilation_cache(
    cfg.run.compilation_cache_dir, cfg.run.compilation_cache_min_compile_secs
)
jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((64, 64))).block_until_ready()
print("USED", repr(used), repr(jax.config.jax_compilation_cache_dir), compilation_cache_stats())
"""


def _probe(overrides, home, **env):
    env = {**os.environ, "HOME": str(home), **env}
    for k in [k for k, v in env.items() if v is None]:
        env.pop(k)
    cmd = [sys.executable, "-c", _PROBE, "+experiment=gpt_shakespeare_char_tiny", *overrides]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.parametrize("off", ["null", ""])
def test_off_writes_nothing_and_the_default_lives_in_the_users_cache_dir(tmp_path, off):
    """`run.compilation_cache_dir=null` (or empty) leaves JAX's cache unset: nothing is written
    anywhere. The control: the same process without the override writes its program into
    ~/.cache/trm-jax-xla of the (temporary) HOME, so "nothing written" is not vacuous."""
    env = {"JAX_COMPILATION_CACHE_DIR": None, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": None}
    off_home, on_home = tmp_path / "off", tmp_path / "on"
    off_home.mkdir()
    on_home.mkdir()
    out = _probe([f"run.compilation_cache_dir={off}"], off_home, **env)
    assert "XLA compilation cache: off (run.compilation_cache_dir is empty)" in out, out
    assert "USED None None" in out, out
    assert list(off_home.rglob("*")) == [], list(off_home.rglob("*"))

    out = _probe(["run.compilation_cache_min_compile_secs=0"], on_home, **env)
    default = str(on_home / ".cache" / "trm-jax-xla")
    assert f"USED {default!r}" in out, out
    assert _entries(default), out


@pytest.mark.parametrize("theirs", ["user_cache", ""])
def test_users_own_jax_cache_dir_wins(tmp_path, theirs):
    """JAX_COMPILATION_CACHE_DIR set by the user is used as it is (and its empty value means off);
    run.compilation_cache_dir is then not applied: nothing appears in it."""
    user_dir = str(tmp_path / theirs) if theirs else ""
    ours = tmp_path / "ours"
    out = _probe(
        [f"run.compilation_cache_dir={ours}"],
        tmp_path,
        JAX_COMPILATION_CACHE_DIR=user_dir,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",  # the user's too: write even tiny programs
    )
    assert not ours.exists(), list(ours.rglob("*"))
    if theirs:
        assert f"XLA compilation cache: {user_dir} (your JAX_COMPILATION_CACHE_DIR" in out, out
        assert _entries(user_dir), out
    else:
        assert "XLA compilation cache: off (your JAX_COMPILATION_CACHE_DIR is empty)" in out, out
        assert "USED None ''" in out, out


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path, under):
    """run.compilation_cache_dir naming a file (or a folder under one): `python -m train.main`
    stops in one line naming the key and the file, before anything compiles (JAX itself would
    warn at each program and cache nothing)."""
    mine = tmp_path / "file"
    mine.write_text("mine")
    cache = mine / under if under else mine
    cmd = [sys.executable, "-m", "train.main", "+experiment=trm_sudoku_tiny",
           f"run.compilation_cache_dir={cache}", f"run.out_dir={tmp_path / 'runs'}",
           f"data.path={tmp_path / 'data'}", "data.build=null", "logging.wandb=disabled"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: run.compilation_cache_dir={str(cache)!r}: {mine} is a file, not a folder; name "
        "a folder, or null to turn the cache off"
    ), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and mine.read_text() == "mine"


def test_cache_dir_values():
    """`~` is expanded and a relative path made absolute (stable if the working directory
    changes); gs:// and other URLs go to JAX (etils.epath) untouched; None/empty = off."""
    assert resolve_dir(DEFAULT_DIR) == os.path.join(
        os.path.expanduser("~"), ".cache", "trm-jax-xla"
    )
    assert resolve_dir("rel/dir") == os.path.join(os.getcwd(), "rel", "dir")
    assert resolve_dir("gs://bucket/jax-cache") == "gs://bucket/jax-cache"
    assert resolve_dir(None) is None and resolve_dir("") is None and resolve_dir("  ") is None
    cfg = load_config(["+experiment=trm_sudoku_tiny"])
    assert cfg.run.compilation_cache_dir == DEFAULT_DIR
    with pytest.raises(ConfigError, match="run.compilation_cache_min_compile_secs"):
        load_config(["+experiment=trm_sudoku_tiny", "run.compilation_cache_min_compile_secs=-1"])
