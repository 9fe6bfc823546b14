"""A third model family from files of its own (tests/toy_family/: a toy MLP on random data),
registered by its module path with no line in train/: it trains 5 steps through
`python -m train.main`, resumes, and goes through `python -m train.evaluate`
(docs/architecture.md, "Adding a model family")."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.helpers import REPO
from train import families
from train.compose import load_config
from train.errors import ConfigError
from train.mesh import make_mesh
from train.metrics import read_jsonl
from train.task import Family
from train.trainer import train

# the family's own config group (tests/toy_family/configs/), as a forker's would be in configs/
SEARCH = f"hydra.searchpath=[file://{REPO}/tests/toy_family/configs]"


def _command(module: str, *args) -> str:
    cmd = [sys.executable, "-m", module, *map(str, args)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _curve(run_dir) -> dict:
    """step -> the train/ and eval/ metrics of metrics.jsonl."""
    out = {}
    for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        out.setdefault(r["step"], {}).update(
            {k: v for k, v in r.items() if k.startswith(("train/loss", "eval/"))}
        )
    return out


def test_a_family_outside_train_trains_resumes_and_evaluates(tmp_path):
    common = [
        SEARCH,
        "+experiment=toy",
        f"run.out_dir={tmp_path}",
        "run.compilation_cache_dir=null",
    ]
    # 3 of its 5 steps, then the same command again: it resumes from step 3 to the end
    _command("train.main", *common, "run.name=split", "trainer.max_steps=3")
    log = _command("train.main", *common, "run.name=split")
    assert "resumed" in log and "from step 3" in log, log[-2000:]
    split = _curve(tmp_path / "split")

    cfg = load_config([*common, "run.name=whole"])  # the same 5 steps without a stop
    train(cfg, make_mesh(cfg.mesh))
    whole = _curve(tmp_path / "whole")
    for step in range(1, 6):  # the resumed curve is the uninterrupted one, bit for bit
        assert split[step]["train/loss"] == whole[step]["train/loss"], (step, split, whole)
    assert whole[5]["train/loss"] < whole[1]["train/loss"]  # it learns
    assert split[5]["eval/accuracy"] == whole[5]["eval/accuracy"]

    out = tmp_path / "report.json"
    printed = _command("train.evaluate", tmp_path / "split", "--json", out)
    report = json.loads(out.read_text())
    assert (report["kind"], report["step"]) == ("run", 5)
    assert report["metrics"] == {k: v for k, v in whole[5].items() if k.startswith("eval/")}
    assert "eval/accuracy" in printed

    # the family's files are its own: nothing in train/ names it
    named = [p for p in pathlib.Path(REPO, "train").rglob("*.py") if "toy" in p.read_text()]
    assert not named, named


def test_the_registry_finds_a_family_by_module_path_and_says_what_is_wrong():
    fam = families.family("tests.toy_family")
    assert isinstance(fam, Family) and fam.task.__name__ == "ToyTask"
    assert families.family("trm") is families.family("train.families.trm")
    with pytest.raises(ConfigError, match="task must be one of"):
        families.family("vit")
    with pytest.raises(ConfigError, match="no module tests.no_such_family"):
        families.family("tests.no_such_family")
    with pytest.raises(ConfigError, match="tests.helpers has no FAMILY"):
        families.family("tests.helpers")
