"""The registry: a config's `family:` -> its model family, the one place the commands look one up.

    fam = family(cfg.family)                 # a train.task.Family: the Task and the commands' pieces
    task = make_task(cfg, mesh)              # backend check, jax x64 when needed, fam.task(cfg, mesh)

Three ways name a family, looked up in this order:

- FAMILIES: the families of this repository (train/families/gpt/, train/families/trm/), each a
  package whose `FAMILY` is a train.task.Family;
- an entry point of the group `trm_jax_port.families` in an installed distribution's metadata
  (the ecosystem's plugin convention), so a family in a package of its own needs no edit here:

      [project.entry-points."trm_jax_port.families"]
      vit = "mylab.vit"              # the package whose FAMILY is a Family (or "mylab.vit:FAMILY")

- a package's module path (`family: mylab.vit`), registered nowhere.

The first two give the short name `family: vit` and list the family where a command offers every
family (train.evaluate's and train.sample's --help, the weights files train.source recognises);
a family named by its module path trains, resumes, evaluates, samples and exports the same.
docs/architecture.md, "Adding a model family".

Packages are imported when first asked for, so a command loads the families it uses.
"""

from __future__ import annotations

import functools
import importlib
from importlib import metadata

import jax

from train.errors import ConfigError
from train.task import Family, Task

FAMILIES: dict[str, str] = {"gpt": "train.families.gpt", "trm": "train.families.trm"}
ENTRY_POINTS = "trm_jax_port.families"  # the entry-point group of families in other packages


@functools.cache
def _entry_points() -> dict[str, metadata.EntryPoint]:
    """The families installed packages declare, by name (read once per process); ConfigError when
    two declare one name or one takes a name of FAMILIES."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINTS):
        clash = FAMILIES.get(ep.name) or (found[ep.name].value if ep.name in found else None)
        if clash is not None and clash != ep.value:
            raise ConfigError(
                f"family name {ep.name!r} is declared twice: {clash} and {ep.value} "
                f"(an entry point of {ep.dist.name if ep.dist else 'an installed package'}); "
                f"rename one of the {ENTRY_POINTS!r} entry points"
            )
        found.setdefault(ep.name, ep)
    return found


def names() -> dict[str, str]:
    """Every registered family: short name -> its package (FAMILIES, then entry points)."""
    return {**FAMILIES, **{n: ep.value for n, ep in _entry_points().items()}}


def family(name: str) -> Family:
    """The Family of `cfg.family`: a registered name (FAMILIES, an entry point) or a package's
    module path ("package" or "package:ATTRIBUTE")."""
    module_name = names().get(name) or (name if "." in name else None)
    if module_name is None:
        raise ConfigError(
            f"family must be one of {sorted(names())} or the module path of a family package "
            f"(one with FAMILY = train.task.Family(...)), got {name!r}"
        )
    module_name, _, attribute = module_name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + ".").startswith(e.name + "."):
            raise  # the package exists; something it imports is missing
        raise ConfigError(f"family={name!r}: no module {module_name} (a family package)") from e
    found = getattr(module, attribute or "FAMILY", None)
    if not isinstance(found, Family):
        raise ConfigError(
            f"family={name!r}: {module_name} has no {attribute or 'FAMILY'} = "
            "train.task.Family(task=...)"
        )
    return found


def registered() -> dict[str, Family]:
    """Every registered family, by name (the ones a command lists)."""
    return {name: family(name) for name in names()}


def make_task(cfg, mesh, *, need_data: bool = True) -> Task:
    """The task of `cfg.family` on `mesh`, after the run's one float64 decision: ConfigError when
    the family cannot run `cfg` on `mesh`'s platform (Task.check_backend: e.g. no float64 on a
    TPU), then jax x64 switched on, process-wide, when the family computes in float64
    (Task.needs_x64), before anything is traced. Data metadata is read from disk unless
    need_data=False. Every command builds its task here."""
    cls = family(cfg.family).task
    cls.check_backend(cfg, mesh.devices.flat[0].platform)
    if cls.needs_x64(cfg):
        jax.config.update("jax_enable_x64", True)
    return cls(cfg, mesh, need_data=need_data)
