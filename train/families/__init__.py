"""The model families by name: `cfg.task` -> its Task class (train/task.py), and the process-wide
x64 switch a family may need.

    task = make_task(cfg, mesh)                 # train/gpt_task.py or train/trm_task.py

A new family is a Task subclass in its own file and one line in FAMILIES.
"""

from __future__ import annotations

import jax

from train.errors import ConfigError
from train.families.gpt.task import GPTTask
from train.families.trm.task import TRMTask
from train.task import Task

FAMILIES: dict[str, type[Task]] = {"gpt": GPTTask, "trm": TRMTask}


def task_class(name: str) -> type[Task]:
    """The Task subclass of `cfg.task`."""
    if name not in FAMILIES:
        raise ConfigError(f"task must be one of {sorted(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


def needs_x64(cfg) -> bool:
    """Whether the run `cfg` needs jax x64 (the family decides: Task.needs_x64)."""
    return task_class(cfg.task).needs_x64(cfg)


def enable_x64_if_needed(cfg) -> bool:
    """Turns jax x64 on when `needs_x64(cfg)`. Process-wide, so call it before building the task
    (every entry point does). Returns whether it did."""
    if needs_x64(cfg):
        jax.config.update("jax_enable_x64", True)
        return True
    return False


def make_task(cfg, mesh, *, need_data: bool = True) -> Task:
    """The task object for `cfg.task` (data metadata is read from disk unless need_data=False)."""
    return task_class(cfg.task)(cfg, mesh, need_data=need_data)
