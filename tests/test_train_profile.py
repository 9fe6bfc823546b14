"""trainer.profile_start / profile_steps (train/profiling.py): a jax.profiler trace of a window
of the trainer's own steps, which `python -m bench.profile --trace` summarises per XLA op. Run
in-process on the toy family (tests/toy_family/), one CPU device."""

from __future__ import annotations

import pytest

from bench import profile
from tests.helpers import REPO
from train.compose import load_config
from train.errors import ConfigError
from train.mesh import make_mesh
from train.trainer import train

SEARCH = f"hydra.searchpath=[file://{REPO}/tests/toy_family/configs]"


def _cfg(tmp_path, *extra):
    return load_config(
        [
            SEARCH,
            "+experiment=toy",
            f"run.out_dir={tmp_path}",
            "run.name=profiled",
            "run.compilation_cache_dir=null",
            *extra,
        ]
    )


def test_a_window_of_trainer_steps_is_traced_and_summarised(tmp_path, capsys, caplog):
    cfg = _cfg(tmp_path, "trainer.profile_start=2", "trainer.profile_steps=2")
    with caplog.at_level("INFO", logger="train.profiling"):
        train(cfg, make_mesh(cfg.mesh))
    traces = list((tmp_path / "profiled" / "profile").rglob("*.trace.json.gz"))
    assert len(traces) == 1, traces
    assert any("profile: steps 2-3 traced" in r.getMessage() for r in caplog.records)

    capsys.readouterr()
    profile.main(["--trace", str(tmp_path / "profiled" / "profile"), "--steps", "2"])
    out = capsys.readouterr().out
    assert "ms of leaf op time per step" in out, out
    span = float(out.split("first op to last: ")[1].split(" ms")[0])  # host gaps included
    assert span > 0, out
    rows = out.splitlines()[4:]
    assert rows and all(float(r.split()[0]) >= 0 for r in rows), out  # one line per XLA op


def test_no_window_writes_no_trace_and_bad_settings_are_named(tmp_path):
    cfg = _cfg(tmp_path, "trainer.max_steps=2")
    train(cfg, make_mesh(cfg.mesh))
    assert not (tmp_path / "profiled" / "profile").exists()
    with pytest.raises(ConfigError, match="trainer.profile_steps"):
        _cfg(tmp_path, "trainer.profile_start=2", "trainer.profile_steps=0")
    with pytest.raises(ConfigError, match="trainer.profile_start"):
        _cfg(tmp_path, "trainer.profile_start=-1")
