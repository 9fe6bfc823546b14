"""The registry: a config's `task:` -> its model family, the one place the commands look one up.

    fam = family(cfg.task)                   # a train.task.Family: the Task and the commands' pieces
    task = make_task(cfg, mesh)              # fam.task(cfg, mesh)

FAMILIES names the families of this repository; each is a package whose `FAMILY` is a
train.task.Family (train/families/gpt/, train/families/trm/). `task:` may also name such a package
by its module path (`task: mylab.vit`), so a family kept outside train/ needs no line here; the
line gives it a short name and lists it where a command offers every family (train.evaluate's and
train.sample's options, the weight files train.source recognises). docs/architecture.md,
"Adding a model family".

Packages are imported when first asked for, so a command loads the families it uses.
"""

from __future__ import annotations

import importlib

import jax

from train.errors import ConfigError
from train.task import Family, Task

FAMILIES: dict[str, str] = {"gpt": "train.families.gpt", "trm": "train.families.trm"}


def family(name: str) -> Family:
    """The Family of `cfg.task`: a name of FAMILIES or a package's module path."""
    module_name = FAMILIES.get(name) or (name if "." in name else None)
    if module_name is None:
        raise ConfigError(
            f"task must be one of {sorted(FAMILIES)} or the module path of a family package "
            f"(one with FAMILY = train.task.Family(...)), got {name!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + ".").startswith(e.name + "."):
            raise  # the package exists; something it imports is missing
        raise ConfigError(f"task={name!r}: no module {module_name} (a family package)") from e
    found = getattr(module, "FAMILY", None)
    if not isinstance(found, Family):
        raise ConfigError(
            f"task={name!r}: {module_name} has no FAMILY = train.task.Family(task=...)"
        )
    return found


def registered() -> dict[str, Family]:
    """Every family of FAMILIES, by name (the ones a command lists)."""
    return {name: family(name) for name in FAMILIES}


def task_class(name: str) -> type[Task]:
    """The Task subclass of `cfg.task`."""
    return family(name).task


def needs_x64(cfg) -> bool:
    """Whether the run `cfg` needs jax x64 (the family decides: Task.needs_x64)."""
    return task_class(cfg.task).needs_x64(cfg)


def check_backend(cfg, platform: str) -> None:
    """ConfigError when the run cannot run as asked on devices of `platform` (Task.check_backend);
    before `enable_x64_if_needed`."""
    task_class(cfg.task).check_backend(cfg, platform)


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
