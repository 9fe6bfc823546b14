"""The registry: a config's `task:` -> its model family, the one place the commands look one up.

    fam = family(cfg.task)                   # a train.task.Family: the Task and the commands' pieces
    task = make_task(cfg, mesh)              # backend check, jax x64 when needed, fam.task(cfg, mesh)

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


def make_task(cfg, mesh, *, need_data: bool = True) -> Task:
    """The task of `cfg.task` on `mesh`, after the run's one float64 decision: ConfigError when
    the family cannot run `cfg` on `mesh`'s platform (Task.check_backend: e.g. no float64 on a
    TPU), then jax x64 switched on, process-wide, when the family computes in float64
    (Task.needs_x64), before anything is traced. Data metadata is read from disk unless
    need_data=False. Every command builds its task here."""
    cls = family(cfg.task).task
    cls.check_backend(cfg, mesh.devices.flat[0].platform)
    if cls.needs_x64(cfg):
        jax.config.update("jax_enable_x64", True)
    return cls(cfg, mesh, need_data=need_data)
