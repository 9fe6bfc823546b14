"""Hydra composition without @hydra.main: every process composes the same config in memory, and
nothing is written by Hydra (process 0 writes the resolved config into the run directory).

`+experiment=NAME` ADDS configs/experiment/NAME.yaml (`# @package _global_`) to the defaults list;
the `+` is required because `experiment` is not in configs/config.yaml's defaults (listing it there
as null AND passing +experiment fails with "Multiple values for experiment").
"""

from __future__ import annotations

import os

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from train import config as config_lib
from train.config import ConfigError
from train.step import task_class

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def load_config(overrides: list[str], config_dir: str = CONFIG_DIR):
    """Composes configs/config.yaml + overrides, checks it against the schema, validates it.

    Raises ConfigError (unknown key, wrong type, bad value, missing experiment) before any compute.
    Model fields that depend on the data set (sizes read from its metadata) are checked when the
    task is built, still before any compute.
    """
    config_lib.register_schema()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"config error: {e}") from e
    OmegaConf.set_struct(cfg, True)
    validate(cfg)
    return cfg


def load_run_config(text: str):
    """A run directory's config.yaml (written by the trainer), checked as `load_config` checks."""
    cfg = OmegaConf.create(text)
    OmegaConf.set_struct(cfg, True)
    validate(cfg)
    return cfg


def validate(cfg) -> None:
    """The trainer's sections (train.config.validate), then the model family's
    (Task.validate_config: model / data / optim). Raises ConfigError."""
    config_lib.validate(cfg)
    task_class(cfg.task).validate_config(cfg)
