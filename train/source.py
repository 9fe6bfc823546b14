"""Open any checkpoint this project reads into (config, task, state, step): the one way in for
`python -m train.evaluate`, `train.sample` and `train.export`.

    src = open_source("runs/trm_sudoku")                  # a run directory, local or gs://
    src = open_source("ckpt/step_65100", data="sudoku")   # upstream TRM (+ all_config.yaml beside it)
    src = open_source("out-shakespeare-char/ckpt.pt")     # a nanoGPT ckpt.pt
    src = open_source("gpt2/model.safetensors")           # HF GPT-2 weights
    src.kind, src.cfg, src.task, src.state, src.step, src.meta

A run directory restores its checkpoint (the latest, or `step`) onto the task its config.yaml
describes; the trainer records the data-derived sizes there (vocabulary, sequence length, puzzle
identifiers), so the run's data set need not be on disk. A file is a checkpoint of a family's
original code base, recognised by that family's WeightsFile (train/task.py; GPT: nanoGPT's
ckpt.pt, HF GPT-2 .safetensors, train/families/gpt/weights.py; TRM: upstream's state_dict,
train/families/trm/weights.py): the config it describes, then a fresh state of that task with
its weights imported (Task.import_weights). Every input problem is one SourceError line naming
the file or option and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from etils import epath
from omegaconf import OmegaConf, open_dict

from train import families, gcs
from train import jit as jit_lib
from train.checkpoint import Checkpointer
from train.compose import compose, load_run_config, validate
from train.errors import ConfigError, one_line
from train.mesh import make_mesh

RUN = "run"  # Source.kind of a run directory; a file's is its WeightsFile's kind


class SourceError(ConfigError):
    """A SOURCE (or an option that goes with it) that cannot be opened; one line."""


@dataclasses.dataclass
class Source:
    kind: str  # "run", or what the WeightsFile that opened the file says it is (kind_of)
    path: str
    cfg: Any  # the composed config: the run's config.yaml, or the one the file describes
    task: Any  # train.task.Task built from cfg
    state: Any  # the task's full state (weights files: a fresh optimizer around the weights)
    step: int | None  # a run's checkpoint step; nanoGPT's iter_num; None otherwise
    meta: dict  # a run's checkpoint meta (best metric, ...); a nanoGPT ckpt.pt's other entries
    trained_on: str | None = None  # the data set the weights were trained on, where known


def open_source(
    path: str,
    *,
    step: int | None = None,
    data: str | None = None,
    overrides=(),
    single_device: bool = False,
    kinds=None,
) -> Source:
    """The Source at `path` (see the module docstring). `step`: a run directory's checkpoint
    (default the latest). `data`: a weights file's data set (nanoGPT: its vocabulary must be the
    file's; upstream TRM: its test split gives seq_len); a run directory reads none. `overrides`:
    key=value (`mesh=NAME` too) for a run directory, Hydra overrides (`+experiment=NAME`,
    `model.x=...`) for a weights file. `single_device`: the task on one device (sampling),
    whatever mesh the config names. `kinds`: the kinds the caller takes (others: SourceError;
    default every kind)."""
    gcs.configure()  # STORAGE_EMULATOR_HOST set: every gs:// client goes to that server
    if data is not None:
        gcs.require(data, "--data")
    if data is not None and not epath.Path(data).exists():
        raise SourceError(f"--data {data}: no such file or directory")
    weights, loaded = _kind(path)
    kind = RUN if weights is None else weights.kind
    if kinds is not None and kind not in kinds:
        names = {RUN: "a run directory"} | {w.kind: w.description for w in _weights_files()}
        raise SourceError(f"{path}: {names[kind]}; expected {' or '.join(names[k] for k in kinds)}")
    if step is not None and weights is not None:
        raise SourceError(f"--step {step}: only a run directory has steps ({path} is a file)")
    if weights is None:
        return _open_run(path, step, list(overrides), single_device)
    opened = weights.open(path, loaded, data, list(overrides))
    task = _make_task(opened.cfg, single_device, need_data=opened.need_data)
    weights.check(path, loaded, task, data)
    try:
        state = task.import_weights(task.create_state(), path)
    except (KeyError, ValueError) as e:
        raise SourceError(f"{path}: does not fit the config ({one_line(e)})") from e
    kind = weights.kind_of(loaded, task)
    return Source(kind, path, opened.cfg, task, state, opened.step, opened.meta, opened.trained_on)


# --- which kind ------------------------------------------------------------------------------
def source_family(path: str):
    """-> (name, Family) of the SOURCE at `path`, without building anything: a run directory's
    config.yaml names it (`family:`, or `task:` in a run of an older version: a registered name or
    a module path); a file is a checkpoint of
    the registered family whose WeightsFile recognises it. SourceError when neither."""
    weights, _ = _kind(path)
    if weights is None:
        config = epath.Path(path) / "config.yaml"
        try:
            saved = OmegaConf.create(config.read_text())
            name = saved.get("family", saved.get("task"))  # task: an older version's key
        except Exception as e:  # a damaged config.yaml
            raise SourceError(f"{config}: does not parse ({one_line(e)})") from e
        if not isinstance(name, str):
            raise SourceError(f"{config}: no `family:` (the model family of the run)")
        try:
            return name, families.family(name)
        except ConfigError as e:
            raise SourceError(f"{config}: {e}") from e
    return next((n, f) for n, f in families.registered().items() if weights in f.weights_files)


def _weights_files() -> list:
    """The WeightsFiles of every registered family, in FAMILIES order."""
    return [w for f in families.registered().values() for w in f.weights_files]


def _kind(path: str):
    """(the WeightsFile that recognises the file, or None for a run directory; the loaded file
    or None). A directory or a URL is a run directory."""
    gcs.require(path, "SOURCE")
    if "://" in path or os.path.isdir(path):
        if not (epath.Path(path) / "config.yaml").exists():
            raise SourceError(
                f"{path}: a directory without config.yaml; expected a run directory of "
                "python -m train.main (config.yaml + checkpoints/), or a checkpoint file"
            )
        return None, None
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such file or run directory")
    from parity.files import UnsafeCheckpointError, load_file
    from parity.state_dict import StateDictError

    candidates = _weights_files()
    expected = ", ".join(["a run directory", *(w.description for w in candidates)])
    try:
        loaded = load_file(path)
    except (StateDictError, UnsafeCheckpointError) as e:
        raise SourceError(one_line(e)) from e
    except Exception as e:  # not a torch / safetensors file at all
        raise SourceError(f"{path}: unknown kind ({one_line(e, 200)}); expected {expected}") from e
    for weights in candidates:
        if weights.detect(path, loaded):
            return weights, loaded
    raise SourceError(f"{path}: unknown kind; expected {expected}")


# --- run directories -------------------------------------------------------------------------
def _open_run(path: str, step, overrides, single_device) -> Source:
    run_dir = epath.Path(path)
    try:
        cfg = load_run_config((run_dir / "config.yaml").read_text(), overrides)
    except ConfigError as e:
        raise SourceError(f"{path}/config.yaml: {e}") from e
    task = _make_task(cfg, single_device, need_data=False)
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint, read_only=True)
    try:
        steps = sorted(ckpt.manager.all_steps())
        if not steps:
            raise SourceError(f"{path}/checkpoints holds no checkpoint")
        if step is not None and step not in steps:
            raise SourceError(f"{path}: --step {step} not saved; checkpoints: {steps}")
        abstract = jit_lib.with_shardings(task.abstract_state, task.state_shardings)
        try:  # the newest that restores (a damaged newer step: one warning line, left in place)
            found = ckpt.restore_newest(abstract, steps=None if step is None else [step])
        except ConfigError as e:  # --step N damaged, or no step restores
            raise SourceError(f"{path}: {e}") from e
        except (ValueError, FileNotFoundError) as e:  # Orbax: shapes that do not fit
            raise SourceError(
                f"{path}/checkpoints/{step} does not restore onto the model of its config.yaml "
                f"{OmegaConf.to_container(cfg.model)} ({one_line(e, 300)})"
            ) from e
        step, state, meta = found
    finally:
        ckpt.close()
    return Source(RUN, path, cfg, task, state, int(step), dict(meta), cfg.data.get("path"))


def _make_task(cfg, single_device: bool, *, need_data: bool):
    """The task of `cfg` on its configured mesh, or on one device."""
    devices = None
    if single_device:
        with open_dict(cfg):
            cfg.mesh.update(data=1, fsdp=1, tensor=1, param_sharding="replicate")
        devices = jax.devices()[:1]
    try:
        mesh = make_mesh(cfg.mesh, devices)
        return families.make_task(cfg, mesh, need_data=need_data)  # e.g. no float64 on a TPU
    except (ValueError, FileNotFoundError) as e:  # ConfigError included
        raise SourceError(one_line(e)) from e


# --- for the families' WeightsFiles ----------------------------------------------------------
def has_experiment(overrides) -> bool:
    return any(o.startswith("+experiment=") for o in overrides)


def run_name_for(path: str) -> str:
    """A run.name for the config of a weights file (its file name)."""
    return os.path.basename(os.path.abspath(path)).replace("=", "_") or "checkpoint"


def compose_for(path: str, overrides: list[str]):
    """The config `overrides` compose (not yet validated: `validate_for` once it is complete)."""
    try:
        return compose(overrides)
    except ConfigError as e:
        raise SourceError(f"{path}: {e}") from e


def validate_for(path: str, cfg) -> None:
    try:
        validate(cfg)
    except ConfigError as e:
        raise SourceError(f"{path}: {e}") from e
