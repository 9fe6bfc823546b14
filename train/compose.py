"""Hydra composition without @hydra.main: every process composes the same config in memory, and
nothing is written by Hydra (process 0 writes the resolved config into the run directory).

`+experiment=NAME` ADDS configs/experiment/NAME.yaml (`# @package _global_`) to the defaults list;
the `+` is required because `experiment` is not in configs/config.yaml's defaults (listing it there
as null AND passing +experiment fails with "Multiple values for experiment").
"""

from __future__ import annotations

import dataclasses
import os

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, OmegaConfBaseException

from train import config as config_lib
from train import families
from train.errors import ConfigError, one_line
from train.families import family

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def load_config(overrides: list[str], config_dir: str = CONFIG_DIR):
    """Composes configs/config.yaml + overrides, checks it against the schema, validates it.

    Raises ConfigError (unknown key, wrong type, bad value, missing experiment) before any compute.
    Model fields that depend on the data set (sizes read from its metadata) are checked when the
    task is built, still before any compute.
    """
    cfg = compose(overrides, config_dir)
    validate(cfg)
    return cfg


def register_schema() -> None:
    """Registers in Hydra's ConfigStore the trainer's schema (`base_config`) and, for every
    registered family, its config dataclasses' defaults as `<section>/<family>_defaults`
    (Task.config_sections), which configs/<section>/*.yaml compose on. Before any composition."""
    config_lib.register_schema()
    store = ConfigStore.instance()
    for name, fam in families.registered().items():
        for section, (cls, filled) in fam.task.config_sections.items():
            node = config_lib.section_defaults(cls, filled)
            store.store(group=section, name=f"{name}_defaults", node=node)


def compose(overrides: list[str], config_dir: str = CONFIG_DIR):
    """`load_config` without the validation: for a caller that completes the config first (a
    weights file's architecture, train/source.py) and then validates it once."""
    register_schema()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(composition_error(e)) from e
    OmegaConf.set_struct(cfg, True)
    return cfg


def composition_error(e: BaseException) -> str:
    """One line for a Hydra / OmegaConf composition error: Hydra's own message says only "Error
    merging override X=Y"; the reason (the value, the expected type, the key) is in its cause."""
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [ln.strip() for ln in str(root).splitlines() if ln.strip()]
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    reason = lines[0] if lines else type(root).__name__
    if isinstance(root, ConfigAttributeError) and key:  # an unknown key of a trainer section
        cls = config_lib.section_of(key)
        if cls is not None:
            section, name = key.rsplit(".", 1)
            known = {f.name for f in dataclasses.fields(cls)}
            return config_lib.unknown_keys_message(section, [name], known, cls.__name__)
    top = one_line(e, limit=10_000)
    if "interpolation '${experiment}'" in top:  # mesh=v4-64 reads configs/tpu/<experiment>.yaml
        return "config error: no experiment given: did you forget +experiment=NAME (configs/experiment/)?"
    if root is e:
        return f"config error: {top}"
    return f"config error: {top}: {f'{key}: ' if key else ''}{reason}"


def load_run_config(text: str, overrides=()):
    """A run directory's config.yaml (written by the trainer) with key=value `overrides`
    (`apply_overrides`), checked as `load_config` checks."""
    cfg = OmegaConf.create(text)
    config_lib.fill_new_keys(cfg)  # a run of an older version lacks the keys added since
    OmegaConf.set_struct(cfg, True)
    apply_overrides(cfg, overrides)
    try:
        validate(cfg)
    except OmegaConfBaseException as e:  # a value of the wrong type (a hand-edited file)
        raise ConfigError(f"config error: {one_line(e)}") from e
    return cfg


def apply_overrides(cfg, overrides) -> None:
    """key=value overrides onto a saved config (a run directory's config.yaml), in place (not
    validated: `load_run_config` validates the result); `mesh=NAME` swaps in
    configs/mesh/NAME.yaml (a v4-64 run evaluated on one machine: mesh=cpu). Group overrides other than mesh and `+key` additions are refused: a saved config
    is already composed."""
    bad = [o for o in overrides if "=" not in o or o.startswith(("+", "~"))]
    if bad:
        raise ConfigError(f"overrides {bad}: a saved config takes key=value overrides only")
    OmegaConf.set_struct(cfg, False)
    try:
        for o in overrides:
            key, value = o.split("=", 1)
            if key == "mesh":
                path = os.path.join(CONFIG_DIR, "mesh", f"{value}.yaml")
                if not os.path.isfile(path):
                    raise ConfigError(f"mesh={value}: no {path}")
                cfg.mesh = OmegaConf.merge(cfg.mesh, OmegaConf.load(path))
            else:
                cfg.merge_with(OmegaConf.from_dotlist([o]))
    finally:
        OmegaConf.set_struct(cfg, True)


def validate(cfg) -> None:
    """The trainer's sections (train.config.validate), then the model family's
    (Task.validate_config: model / data / optim). Raises ConfigError."""
    config_lib.validate(cfg)
    family(cfg.task).task.validate_config(cfg)
