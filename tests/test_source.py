"""train.source.open_source, the one way in for every checkpoint: a run directory opens without its
data set (config.yaml records the sizes the data gave), every kind is told apart, and a kind the
caller does not take is one line."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest
import yaml

from parity.compare import EXACT, assert_close
from tests.helpers import build_tiny_text, tiny_gpt_overrides
from train.compose import load_config
from train.mesh import make_mesh
from train.source import SourceError, open_source
from train.trainer import train


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A 3-step tiny char GPT run whose data set is then moved away: -> (run dir, data dir)."""
    root = tmp_path_factory.mktemp("source")
    data = build_tiny_text(str(root / "text"))
    cfg = load_config(tiny_gpt_overrides(data, str(root), "run", steps=3))
    train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    moved = str(root / "moved_text")
    shutil.move(data, moved)
    return str(root / "run"), moved


def test_a_run_directory_opens_without_its_data_set(gpt_run):
    """The trainer took vocab_size=47 from the data set's meta (the experiment says 65) and wrote
    it into config.yaml: with the data set gone the run still restores, onto the same shapes."""
    run_dir, _ = gpt_run
    with open(os.path.join(run_dir, "config.yaml")) as f:
        assert yaml.safe_load(f)["model"]["vocab_size"] == 47
    src = open_source(run_dir)
    assert (src.kind, src.step, src.task.model_cfg.vocab_size) == ("run", 3, 47)
    wte = src.state[0]["wte"]["embedding"][...]  # (model, optimizer) state
    assert wte.shape == (47, 32)
    again = open_source(run_dir, step=3, single_device=True)
    assert_close("restored wte", np.asarray(again.state[0]["wte"]["embedding"][...]),
                 np.asarray(wte), EXACT)  # fmt: skip


def test_kinds_and_their_errors_are_one_line(gpt_run, tmp_path):
    run_dir, _ = gpt_run
    cases = {
        str(tmp_path / "nope"): "no such file or run directory",
        str(tmp_path): "a directory without config.yaml",
    }
    junk = tmp_path / "weights.bin"
    junk.write_bytes(b"not a checkpoint")
    cases[str(junk)] = "unknown kind"
    for path, expected in cases.items():
        with pytest.raises(SourceError, match=expected) as e:
            open_source(path)
        assert "\n" not in str(e.value)
    with pytest.raises(SourceError, match="a run directory; expected a nanoGPT ckpt.pt"):
        open_source(run_dir, kinds=("nanogpt",))
    with pytest.raises(SourceError, match=r"--step 7 not saved; checkpoints: \[3\]"):
        open_source(run_dir, step=7)
    with pytest.raises(SourceError, match="mesh=nope: no "):
        open_source(run_dir, overrides=["mesh=nope"])
