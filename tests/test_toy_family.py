"""A third model family from files of its own (tests/toy_family/: a toy MLP on random data), with no
line in train/: registered by an entry point (tests/conftest.py puts its .dist-info on every test
process's path) and reachable by its module path too. It trains 5 steps through
`python -m train.main`, resumes, goes through `python -m train.evaluate` and `train.sample` with
options of its own (one named like GPT's), and what it lacks (an original code base's checkpoints)
is one line (docs/architecture.md, "Adding a model family")."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
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


def _command(module: str, *args, returncode: int = 0, env=None) -> str:
    cmd = [sys.executable, "-m", module, *map(str, args)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == returncode, done.stdout[-2000:] + done.stderr[-3000:]
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
    assert "examples 64: accuracy" in printed, printed  # its Evaluation's table

    # its own evaluation option, and its sampler's --start (GPT's sampler has one too): the
    # commands' own main, in this process
    from train import evaluate as evaluate_cmd
    from train import export as export_cmd
    from train import sample as sample_cmd

    assert evaluate_cmd.main([str(tmp_path / "split"), "--examples", "32"])["examples"] == 32
    texts = sample_cmd.main([str(tmp_path / "split"), "--start", "2", "--num-samples", "3"])
    assert texts == [
        f"input 2:{i} -> class {c}" for i, c in enumerate(_predicted(tmp_path / "split", 2, 3))
    ]
    # without its registration (no entry point on the path): the run names its family by module
    # path, and the sampler still takes the family's own options
    unregistered = dict(os.environ, PYTHONPATH=REPO)
    printed = _command("train.sample", tmp_path / "split", "--start", 2, "--num-samples", 1,
                       env=unregistered)  # fmt: skip
    assert "input 2:0 -> class" in printed, printed
    # what it has not: one line (sys.exit's message: printed, exit status 1)
    with pytest.raises(SystemExit) as e:
        export_cmd.main([str(tmp_path / "split"), "--out", str(tmp_path / "x.pt")])
    assert e.value.code == (
        "error: tests.toy_family: the family writes no checkpoint in an original code base's "
        "format (Task.torch_checkpoint)"
    )

    # the family's files are its own: nothing in train/ names it
    named = [p for p in pathlib.Path(REPO, "train").rglob("*.py") if "toy" in p.read_text()]
    assert not named, named


def test_the_registry_finds_a_family_by_module_path_and_says_what_is_wrong():
    fam = families.family("tests.toy_family")
    assert isinstance(fam, Family) and fam.task.__name__ == "ToyTask"
    assert families.family("trm") is families.family("train.families.trm")
    with pytest.raises(ConfigError, match="family must be one of"):
        families.family("vit")
    with pytest.raises(ConfigError, match="no module tests.no_such_family"):
        families.family("tests.no_such_family")
    with pytest.raises(ConfigError, match="tests.helpers has no FAMILY"):
        families.family("tests.helpers")


def _predicted(run_dir, start: int, rows: int) -> list[int]:
    """The classes the run's latest checkpoint predicts for batch `start` of the toy stream."""
    from tests.toy_family.task import toy_batch
    from train.source import open_source

    src = open_source(str(run_dir), single_device=True)
    model, _ = src.task.model(src.state)
    x = toy_batch(src.cfg.run.seed, start, rows, src.task.model_cfg)["x"]
    return [int(c) for c in jax.device_get(model(x).argmax(-1))]


def test_the_entry_point_registers_it_by_name():
    """The .dist-info's entry point gives the short name, which composes and names the same
    Family as the module path; a clash with a name of FAMILIES would be one line."""
    assert families.names()["toy"] == "tests.toy_family"
    assert families.family("toy") is families.family("tests.toy_family")
    assert set(families.registered()) == {"gpt", "trm", "toy"}
    cfg = load_config([SEARCH, "+experiment=toy", "family=toy"])
    assert families.family(cfg.family).task.__name__ == "ToyTask"


def test_commands_list_each_family_options_apart():
    """`train.sample --help` and `train.evaluate --help` list every registered family's options
    under its own name: GPT's and the toy's --start both, without a clash."""
    from train import evaluate as evaluate_cmd
    from train import sample as sample_cmd

    printed = sample_cmd.COMMAND.help()  # what --help prints
    gpt, toy = printed.index("gpt options:"), printed.index("toy options:")
    assert "--start START" in printed[gpt:toy] and "--start START" in printed[toy:], printed
    printed = evaluate_cmd.COMMAND.help()
    assert "toy options:" in printed and "--examples N" in printed, printed


def test_a_family_without_an_original_code_base_says_so_in_one_line(tmp_path):
    """trainer.init_from on a family that reads no original checkpoint: one ConfigError line
    naming the key and the hook, before anything trains."""
    weights = tmp_path / "weights.pt"
    weights.write_bytes(b"not read")
    cfg = load_config([
        SEARCH, "+experiment=toy", f"run.out_dir={tmp_path}", "run.compilation_cache_dir=null",
        f"trainer.init_from={weights}",
    ])  # fmt: skip
    with pytest.raises(ConfigError) as e:
        train(cfg, make_mesh(cfg.mesh))
    assert str(e.value) == (
        f"trainer.init_from={str(weights)!r}: cannot import it: tests.toy_family: the family reads "
        "no checkpoint of an original code base (Task.import_weights)"
    )


def test_an_evaluations_output_shardings_are_derived():
    """Task.output_shardings: an evaluation returns a dict of any shape and its shardings follow
    from it: a leaf whose leading axis follows the batch's rows is sharded like the batch, every
    other replicated, a curve as long as the batch has rows included."""
    import jax.numpy as jnp

    cfg = load_config([SEARCH, "+experiment=toy"])
    task = families.family(cfg.family).task(cfg, make_mesh(cfg.mesh))
    rows = 16

    def evaluation(state, batch):
        model, _ = task.model(state)
        logits = model(batch["x"])
        return {
            "sums": {"count": jnp.float32(batch["y"].shape[0]), "loss": logits.sum()},
            "curve": jnp.zeros(rows),  # per step, not per row: as long as the batch by chance
            "logits": logits,
            "correct": logits.argmax(-1) == batch["y"],
        }

    out = task.output_shardings(evaluation, task.abstract_state, task.batch_shapes(rows))
    specs = jax.tree.map(lambda s: tuple(s.spec), out)
    per_row = tuple(task.batch_sharding(1).spec)
    assert per_row[0] is not None  # the batch axis is sharded on this mesh
    assert specs == {
        "sums": {"count": (), "loss": ()},
        "curve": (),
        "logits": (*per_row, None),
        "correct": per_row,
    }, specs
