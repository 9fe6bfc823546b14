"""The data of a TRM run: the `data` section (TRMDataConfig), building a puzzle data set on first
use, and the checks that a data set in upstream's layout fits the model and the batch.

    prepare_data(cfg.data)                    # data.build run when data.path holds none yet
    sizes = data_sizes(path)                  # the train split's sizes, recorded in config.yaml
    check_split(path, "test", model_cfg, "--data")
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os

from data import provenance
from data.provenance import NotReplaced
from data.puzzle_format import load_metadata, load_split
from models.fields import ranged
from train.errors import ConfigError, one_line
from train.task import build_once

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TRMDataConfig:
    """The `data` section of a puzzle data set (configs/data/sudoku.yaml, maze, arc1, arc2)."""

    path: str = ""  # upstream's layout: train/ and test/ with dataset.json and .npy arrays
    build: str | None = None  # a data module (data.sudoku_easy, ...) run when `path` is empty
    build_args: list = dataclasses.field(default_factory=list)  # its command-line arguments
    # upstream's epochs: passes over the train split, the schedule's length (trainer.total_steps
    # 0) and the data the loader yields; beside eval_interval_epochs, which divides it
    epochs: int = ranged(0, ">=0")
    eval_interval_epochs: int = ranged(
        0, ">=0"
    )  # upstream eval_interval: epochs per iteration (0: epochs)
    eval_batch_size: int = ranged(0, ">=0")  # 0: trainer.global_batch_size
    evaluator: str = ""  # "" or arc (data.arc_eval)
    # The data set's sizes (SIZES). Read from its train/dataset.json when it is on disk (and
    # recorded here in the run's config.yaml); a data set's config states them for a command
    # that runs without it (AOT compilation: configs/data/*.yaml). None: unknown until built.
    seq_len: int | None = ranged(None, ">0")
    vocab_size: int | None = ranged(None, ">0")
    num_puzzle_identifiers: int | None = ranged(None, ">0")
    total_groups: int | None = ranged(None, ">0")
    mean_puzzle_examples: float | None = ranged(None, ">0")


SIZES = ("seq_len", "vocab_size", "num_puzzle_identifiers", "total_groups", "mean_puzzle_examples")


def prepare_data(d) -> None:
    """Builds the data set of the `data` section `d` with data.build when data.path holds none,
    or holds one its build record says was built with other settings (data.provenance.prepare)."""
    path, builder = d.get("path", ""), d.get("build")
    if not path:
        raise ConfigError("data.path: a puzzle data set directory (upstream layout) is required")
    if not builder:
        if os.path.exists(os.path.join(path, "train", "dataset.json")):
            return
        raise ConfigError(
            f"data.path={path!r} has no train/dataset.json; build it first "
            "(python -m data.sudoku / data.maze / data.arc, see configs/data/)"
        )
    build_args = list(d.get("build_args", []))
    args = [*build_args, "--output-dir", path]
    module = builder if "." in builder else f"data.{builder}"
    try:
        builder_module = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not (module + ".").startswith(e.name + "."):
            raise  # the builder exists; something it imports is missing
        raise ConfigError(
            f"data.build={builder!r}: no module {module} (a builder of data/, e.g. sudoku_easy, "
            "or the module path of one with main(argv))"
        ) from e
    what = f"data.build={builder} with data.build_args={build_args}"
    try:
        record = getattr(builder_module, "build_record", None)
        provenance.prepare(
            path,
            what,
            record(args) if record else None,
            lambda p: os.path.exists(os.path.join(p, "train", "dataset.json")),
            lambda: build_once("trm_data_built", lambda: builder_module.main(args)),
        )
    except NotReplaced as e:
        raise ConfigError(f"data.path={path!r} ({what}): {e}") from e
    except (OSError, ValueError) as e:  # a bad build_args value, a missing input file
        raise ConfigError(f"{what}: {one_line(e)}") from e


def check_sizes_known(d: TRMDataConfig) -> None:
    """ConfigError naming the sizes (SIZES) a data section leaves unknown: a command that runs
    without the data set on disk reads them from the config."""
    unknown = [k for k in SIZES if getattr(d, k) is None]
    if unknown:
        raise ConfigError(
            f"data.{unknown[0]}: unknown without the data set (data.path={d.path!r} holds no "
            f"train/dataset.json); build it, or give {', '.join(f'data.{k}' for k in unknown)} "
            "(configs/data/sudoku.yaml states Sudoku-Extreme's)"
        )


def data_sizes(data_dir: str) -> dict:
    """The sizes (SIZES) of the train split of `data_dir`, from its dataset.json (ConfigError
    naming data.path, the file and the field when it does not load)."""
    meta = _metadata(data_dir, "train", "data.path")
    return {k: getattr(meta, k) for k in SIZES}


def _metadata(data_dir: str, split: str, option: str):
    """`split`'s dataset.json, its format errors (they name the file and the field) one line
    naming `option`."""
    try:
        return load_metadata(data_dir, split)
    except (OSError, ValueError) as e:  # PuzzleFormatError is a ValueError
        raise ConfigError(f"{option}: {one_line(e)}") from e


def test_metadata(data_dir: str):
    """The test split's metadata of a data set in the upstream layout (ConfigError without one)."""
    if not os.path.isfile(os.path.join(data_dir, "test", "dataset.json")):
        raise ConfigError(
            f"--data {data_dir}: no test/dataset.json; expected a data set in the upstream "
            "layout (python -m data.sudoku / data.maze / data.arc), or a Sudoku CSV file"
        )
    return _metadata(data_dir, "test", "--data")


def check_split(data_dir: str, split: str, model_cfg, option: str) -> None:
    """ConfigError (naming `option`, the file and the key) unless `data_dir`'s `split` loads
    and its seq_len, vocabulary and puzzle identifiers fit the model."""
    try:
        meta = load_split(data_dir, split, mmap=True).metadata
    except (OSError, ValueError) as e:  # PuzzleFormatError is a ValueError
        raise ConfigError(f"{option}: {split} split: {e}") from e
    m, where = model_cfg, os.path.join(data_dir, split, "dataset.json")
    for key, have, limit in (
        ("seq_len", meta.seq_len, m.seq_len),
        ("vocab_size", meta.vocab_size, m.vocab_size),
        ("num_puzzle_identifiers", meta.num_puzzle_identifiers, m.num_puzzle_identifiers),
    ):
        if have != limit if key == "seq_len" else have > limit:
            raise ConfigError(f"{option} {where}: {key}={have}, but the model has {key}={limit}")


def check_identifiers(data_dir: str, trained_on: str | None, model_cfg) -> None:
    """An ARC set's identifiers.json is the one the weights were trained with (puzzle
    identifiers index the trained embedding table): ConfigError when both are known and differ."""
    mine, theirs = (
        os.path.join(p, "identifiers.json") if p else "" for p in (data_dir, trained_on)
    )
    if not (
        model_cfg.num_puzzle_identifiers > 1
        and trained_on
        and os.path.abspath(data_dir) != os.path.abspath(trained_on)
        and os.path.isfile(mine)
        and os.path.isfile(theirs)
    ):
        return
    with open(mine) as f, open(theirs) as g:
        if json.load(f) != json.load(g):
            raise ConfigError(
                f"--data {mine} differs from the run's {theirs}: puzzle identifiers index "
                "the trained puzzle embeddings, so evaluate on the data set the run was "
                'trained with (docs/evaluation.md, "ARC puzzle identifiers index the trained puzzle embeddings")'
            )


def check_batch_fits(d: TRMDataConfig, batch: int, epochs: int, eval_epochs: int, total_steps: int):
    """ConfigError when the batch is larger than the data: upstream's step count rounds down
    to 0, or an iteration (eval_interval_epochs epochs) holds less than one batch, so the
    run would end without a step."""
    per_epoch = d.total_groups * d.mean_puzzle_examples  # one example drawn per group
    where = (
        f"data.path={d.path!r}: {per_epoch:g} examples per epoch "
        f"({d.total_groups} groups x {d.mean_puzzle_examples:g})"
    )
    if total_steps <= 0:
        raise ConfigError(
            f"trainer.global_batch_size={batch} is larger than the data set: "
            f"data.epochs={epochs} x {where} gives 0 steps; lower the batch or "
            "raise data.epochs"
        )
    if epochs and eval_epochs * per_epoch < batch:
        raise ConfigError(
            f"trainer.global_batch_size={batch} is larger than one iteration of the "
            f"data set: data.eval_interval_epochs={eval_epochs} x {where} holds no "
            "full batch; lower the batch or raise data.eval_interval_epochs"
        )
