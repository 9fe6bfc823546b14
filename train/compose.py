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

from train.config import ConfigError, register_schema, validate

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def load_config(overrides: list[str], config_dir: str = CONFIG_DIR):
    """Composes configs/config.yaml + overrides, checks it against the schema, validates it.

    Raises ConfigError (unknown key, wrong type, bad value, missing experiment) before any compute.
    """
    register_schema()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"config error: {e}") from e
    OmegaConf.set_struct(cfg, True)
    validate(cfg)
    return cfg
