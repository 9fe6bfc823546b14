"""Up-front data validation (Task.validate_data, GPT): a missing / broken split or a token id
beyond the model's vocabulary stops the run before step 1 with one ConfigError line naming the
file; so does a trainer.init_from that does not exist."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest

from tests.helpers import build_tiny_text, tiny_gpt_overrides
from train.compose import load_config
from train.errors import ConfigError
from train.mesh import make_mesh
from train.trainer import train


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_tiny_text(str(tmp_path_factory.mktemp("synthetic_char")))


def _fails_before_step_1(data_dir, out, extra=()) -> str:
    return _run_fails_before_step_1(out, tiny_gpt_overrides(data_dir, out, "r") + list(extra))


def _run_fails_before_step_1(out, overrides) -> str:
    """train() raises a one-line ConfigError and no step ran (no metrics.jsonl)."""
    cfg = load_config(overrides)
    with pytest.raises(ConfigError) as e:
        train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    assert not os.path.exists(os.path.join(out, "r", "metrics.jsonl"))  # no step ran
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("how", ["missing", "odd_bytes", "too_short", "token_beyond_vocab"])
def test_broken_val_split_fails_before_step_1(text_dir, tmp_path, how):
    data = str(tmp_path / "data")
    shutil.copytree(text_dir, data)
    val = os.path.join(data, "val.bin")
    if how == "missing":
        os.remove(val)
    elif how == "odd_bytes":
        with open(val, "ab") as f:
            f.write(b"\0")
    elif how == "too_short":
        np.zeros(5, np.uint16).tofile(val)
    else:
        tokens = np.fromfile(val, np.uint16)
        tokens[10] = 60000
        tokens.tofile(val)
    msg = _fails_before_step_1(data, str(tmp_path / "out"))
    assert val in msg, msg
    if how == "token_beyond_vocab":
        assert "60000" in msg and "vocab_size" in msg, msg


def test_missing_init_from_fails_before_step_1(text_dir, tmp_path):
    path = str(tmp_path / "nope.pt")
    msg = _fails_before_step_1(text_dir, str(tmp_path / "out"), [f"trainer.init_from={path}"])
    assert path in msg, msg


@pytest.fixture(scope="module")
def sudoku_dir(tmp_path_factory):
    from tests.helpers import build_tiny_sudoku

    return build_tiny_sudoku(str(tmp_path_factory.mktemp("sudoku")))


def _trm_fails_before_step_1(data_dir, out) -> str:
    from tests.helpers import tiny_trm_overrides

    # float32 loss: train() would otherwise switch jax x64 on for this whole test process
    return _run_fails_before_step_1(
        out, tiny_trm_overrides(data_dir, out, "r") + ["model.loss_dtype=float32"]
    )


@pytest.mark.parametrize("how", ["truncated_inputs", "missing_labels", "vocab_beyond_model"])
def test_broken_trm_test_split_fails_before_step_1(sudoku_dir, tmp_path, how):
    """A corrupt test split fails before step 1, not at the first evaluation after a whole
    iteration."""
    import json

    data = str(tmp_path / "data")
    shutil.copytree(sudoku_dir, data)
    test = os.path.join(data, "test")
    if how == "truncated_inputs":
        path = os.path.join(test, "all__inputs.npy")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif how == "missing_labels":
        path = os.path.join(test, "all__labels.npy")
        os.remove(path)
    else:
        path = os.path.join(test, "dataset.json")
        with open(path) as f:
            meta = json.load(f)
        meta["vocab_size"] += 5
        with open(path, "w") as f:
            json.dump(meta, f)
    msg = _trm_fails_before_step_1(data, str(tmp_path / "out"))
    assert path in msg, msg
