"""Two JAX processes x 4 CPU devices (gloo collectives, one coordinator on a free port) train the
same loss curve as one process with 8 devices: per-process data shards assembled with
make_array_from_process_local_data, one shared Orbax checkpoint, only process 0 logs."""

from __future__ import annotations

import os
import sys

import pytest

from parity.compare import FLOAT32, assert_close
from train.launch import run_local_processes
from train.testing import build_tiny_sudoku, losses, tiny_trm_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.multiprocess
@pytest.mark.slow  # ~60 s alone, minutes on a loaded 2-core box
def test_two_processes_match_one_process_with_8_devices(tmp_path):
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    out = str(tmp_path / "runs")
    cmd = [sys.executable, "-m", "train.main"]
    run_local_processes(
        cmd + tiny_trm_overrides(data, out, "one_process"),
        num_processes=1,
        devices_per_process=8,
        timeout=400,
        cwd=REPO,
    )
    run_local_processes(
        cmd + tiny_trm_overrides(data, out, "two_processes"),
        num_processes=2,
        devices_per_process=4,
        timeout=400,
        cwd=REPO,
    )
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
