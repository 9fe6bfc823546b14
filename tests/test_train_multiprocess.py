"""Two JAX processes x 4 CPU devices (gloo collectives, one coordinator on a free port) train the
same loss curve as one process with 8 devices: per-process data shards assembled with
make_array_from_process_local_data, one shared Orbax checkpoint, only process 0 logs.

All runs share one XLA compilation cache directory (as processes on one host share
~/.cache/trm-jax-xla): JAX writes entries from process 0 only, and a rerun of the two-process job
loads its programs on process 0 and trains the same curve."""

from __future__ import annotations

import os
import sys

import pytest

from parity.compare import EXACT, FLOAT32, assert_close
from tests.helpers import (
    REPO,
    build_tiny_sudoku,
    compilation_cache_counts,
    losses,
    run_local,
    tiny_trm_overrides,
)


@pytest.mark.multiprocess
@pytest.mark.slow  # ~60 s alone, minutes on a loaded 2-core box
def test_two_processes_match_one_process_with_8_devices(tmp_path):
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    out, cache = str(tmp_path / "runs"), str(tmp_path / "xla_cache")
    # min 0 s: every program is written, so a rerun must load ALL of them
    cmd = [sys.executable, "-m", "train.main", "run.compilation_cache_min_compile_secs=0"]

    def train(name: str, processes: int):
        overrides = tiny_trm_overrides(data, out, name, cache_dir=cache)
        return run_local(
            cmd + overrides, processes=processes, cpu_devices=8 // processes, timeout=400, cwd=REPO
        )

    train("one_process", 1)
    first = train("two_processes", 2)
    one = losses(os.path.join(out, "one_process"), "train/lm_loss")
    two = losses(os.path.join(out, "two_processes"), "train/lm_loss")
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    # Same SPMD program on the same 8-device mesh; only the collectives' implementation (gloo
    # across processes vs in-process) may order fp32 sums differently.
    assert_close(
        "train/lm_loss 2 processes vs 1",
        [two[s] for s in sorted(two)],
        [one[s] for s in sorted(one)],
        FLOAT32,
    )
    # process 0 alone writes logs and the config; both wrote their checkpoint shards and data state
    run = os.path.join(out, "two_processes")
    assert os.path.exists(os.path.join(run, "config.yaml"))
    data_dir = os.path.join(run, "checkpoints", "4", "data")
    files = sorted(f for f in os.listdir(data_dir) if f.endswith(".json"))
    assert files == ["process_0-of-2.json", "process_1-of-2.json"]

    # The compilation cache, shared by both processes: process 1 never writes (JAX's rule)...
    stats = [compilation_cache_counts(output) for _, output in first]
    assert stats[0]["writes"] > 0 and stats[1]["writes"] == 0, stats
    # ...and the same job again loads every program on process 0 and computes exactly what the
    # first did. Process 1 compiles its own: on the CPU backend the cache key hashes a topology
    # fingerprint that differs per process (jax 0.10.2; docs/training.md, "Compilation cache").
    again = train("again", 2)
    s0, s1 = (compilation_cache_counts(output) for _, output in again)
    assert s0["requests"] > 0 and s0["hits"] == s0["requests"], (s0, stats)
    assert s1["requests"] > 0 and s1["writes"] == 0, (s1, stats)
    rerun = losses(os.path.join(out, "again"), "train/lm_loss")
    assert_close(
        "train/lm_loss 2 processes, warm cache vs cold",
        [rerun[s] for s in sorted(two)],
        [two[s] for s in sorted(two)],
        EXACT,
    )
