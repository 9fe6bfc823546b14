"""Hydra composition without @hydra.main: every process composes the same config in memory, and
nothing is written by Hydra (process 0 writes the resolved config into the run directory).

`+experiment=NAME` ADDS configs/experiment/NAME.yaml (`# @package _global_`) to the defaults list;
the `+` is required because `experiment` is not in configs/config.yaml's defaults (listing it there
as null AND passing +experiment fails with "Multiple values for experiment").
"""

from __future__ import annotations

import dataclasses
import os
import re

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

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


PLATFORM_DEFAULT = "platform_default"  # the resolver of a field with platform defaults


def register_schema() -> None:
    """Registers in Hydra's ConfigStore the trainer's schema (`base_config`) and, for every
    registered family, its config dataclasses' defaults as `<section>/<family>_defaults`
    (Task.config_sections), which configs/<section>/*.yaml compose on. Before any composition.

    A field the family gives a platform default (Task.platform_defaults) holds
    `${platform_default:<family>,<section>.<field>}` there: the lowest layer of the composition,
    so any config file or override that sets the field replaces it, and what is left resolves
    to the value for `mesh.platform`, else the dataclass default (`platform_default`)."""
    config_lib.register_schema()
    OmegaConf.register_new_resolver(PLATFORM_DEFAULT, platform_default, replace=True)
    store = ConfigStore.instance()
    for name, fam in families.registered().items():
        by_platform = fam.task.platform_defaults.values()
        keys = {key for values in by_platform for key in values}
        for section, (cls, filled) in fam.task.config_sections.items():
            node = config_lib.section_defaults(cls, filled)
            for key in sorted(k for k in keys if k.startswith(f"{section}.")):
                node[key.split(".", 1)[1]] = f"${{{PLATFORM_DEFAULT}:{name},{key}}}"
            store.store(group=section, name=f"{name}_defaults", node=node)


def platform_default(name: str, key: str, *, _root_):
    """The default of family `name`'s field `key` ("<section>.<field>") on the config's
    `mesh.platform`: the family's platform default there, else its dataclass default."""
    task = family(name).task
    platform = OmegaConf.select(_root_, "mesh.platform", default="")
    values = task.platform_defaults.get(platform, {})
    if key in values:
        return values[key]
    section, field = key.split(".", 1)
    cls = task.config_sections[section][0]
    return config_lib.section_defaults(cls)[field]


def resolve_family_sections(cfg) -> None:
    """The family's sections (model / data / optim) of a composed config with their
    interpolations resolved, in place: the platform defaults become values before anything
    reads or copies a section."""
    for section in ("model", "data", "optim"):
        if isinstance(cfg.get(section), DictConfig):
            OmegaConf.resolve(cfg[section])


def compose(overrides: list[str], config_dir: str = CONFIG_DIR, *, hydra_config: bool = False):
    """`load_config` without the validation: for a caller that completes the config first (a
    weights file's architecture, train/source.py) and then validates it once. `hydra_config`:
    with Hydra's own `hydra` section, so `hydra.*` overrides apply (train.main checks a Hydra
    command line's overrides so)."""
    register_schema()
    for o in overrides:  # Hydra's grammar error names neither the override nor the fix
        key = o.split("=", 1)[0]
        if "=" in o and _parsed(o) is _UNPARSED and _parsed(key + "=x") is not _UNPARSED:
            value = o.split("=", 1)[1]
            raise ConfigError(
                f"{o!r}: Hydra's override grammar does not read this value (spaces, parentheses, "
                f'quotes and commas need quoting); quote it: "{override(key, value)}"'
            )
    try:
        cfg = _compose(overrides, config_dir, hydra_config)
        resolve_family_sections(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        # ValueError: OmegaConf's, for a list indexed by a key that is not a number
        raise ConfigError(composition_error(e, overrides, config_dir, hydra_config)) from e
    OmegaConf.set_struct(cfg, True)
    return cfg


def _compose(overrides, config_dir: str, hydra_config: bool):
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return hydra_compose(
            config_name="config", overrides=list(overrides), return_hydra_config=hydra_config
        )


def composition_error(e: BaseException, overrides=(), config_dir: str = CONFIG_DIR,
                      hydra_config: bool = False) -> str:  # fmt: skip
    """One line for a Hydra / OmegaConf composition error: Hydra's own message says only "Error
    merging override X=Y"; the reason (the value, the expected type, the key) is in its cause. An
    unknown key is the line every section's unknown key gets (`unknown_key_line`)."""
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [ln.strip() for ln in str(root).splitlines() if ln.strip()]
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    reason = lines[0] if lines else type(root).__name__
    unknown = isinstance(root, ConfigAttributeError | ConfigKeyError) and bool(key)
    if unknown or type(root) is ValueError:
        line = unknown_key_line(key, overrides, config_dir, hydra_config)
        if line is not None:
            return line
    top = one_line(e, limit=10_000)
    if root is e:
        return f"config error: {top}"
    return f"config error: {top}: {f'{key}: ' if key else ''}{reason}"


def override(key: str, value) -> str:
    """`key=value` as Hydra's override grammar reads back exactly `value`, whatever a file it
    came from holds (a path with spaces or parentheses, quotes, backslashes, `${...}`, which
    OmegaConf would otherwise resolve): a string that would not read back as itself is
    single-quoted, its quotes escaped."""
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, int | float):
        return f"{key}={value!r}"
    if re.fullmatch(r"[\w./@:+-]+", str(value)) and _parsed(f"{key}={value}") == value:
        return f"{key}={value}"  # reads back as itself: kept as a user would type it
    text = str(value).replace("${", "\\${")  # a literal, not an interpolation
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)  # before the closing quote
    return f"{key}='{text}'"


_UNPARSED = object()


def _parsed(text: str):
    """The value Hydra's override grammar reads from `key=value` (_UNPARSED when it does not)."""
    try:
        return OverridesParser.create().parse_override(text).value()
    except HydraException:
        return _UNPARSED


def unknown_key_line(key: str, overrides=(), config_dir: str = CONFIG_DIR,
                     hydra_config: bool = False) -> str | None:  # fmt: skip
    """The one line of an override whose key the config does not have: the section, the key, a
    close match and the section's keys (train.config.unknown_keys_message, as the validation says
    it of a key added with `+`), or the list it indexes with a name. `key` "" (OmegaConf's
    ValueError names none): the first override that is such a key. None when the key is new under
    a free-form mapping (Hydra's own "+key" advice then stands)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    given = [o.key_or_group for o in parsed if not o.is_add() and not o.is_force_add()]
    # the config's shape without the dotted overrides (their values do not change it)
    base = [o.input_line for o in parsed if "." not in o.key_or_group and o.key_or_group != key]
    try:
        cfg = _compose(base, config_dir, hydra_config)
    except (HydraException, OmegaConfBaseException, ValueError):  # a config file's own key
        try:
            cfg = _compose([], config_dir, hydra_config)
        except (HydraException, OmegaConfBaseException, ValueError):
            return None
    for k in [key] if key else given:
        line = _missing_key_line(cfg, k)
        if line is not None:
            return line
    return None


def _missing_key_line(cfg, key: str) -> str | None:
    """`unknown_key_line`'s answer for `key` in `cfg`; None when `cfg` has it or takes it."""
    node, parent = cfg, ""
    for part in key.split("."):
        if isinstance(node, ListConfig):
            if part.isdigit() and int(part) < len(node):
                node, parent = node[int(part)], f"{parent}.{part}"
                continue
            return (
                f"config error: {key}: {parent} is a list; its items are {parent}.0 to "
                f"{parent}.{len(node) - 1}"
            )
        if not isinstance(node, DictConfig):
            return None
        if part not in node:
            known, owner = _known_keys(cfg, parent)
            if known is None:
                return None
            if owner is None:
                return (
                    f"config error: {key}: the {parent} section's keys come with the model family; "
                    "did you forget +experiment=NAME (configs/experiment/)?"
                )
            moved = moved_keys(OmegaConf.select(cfg, "family", throw_on_missing=False))
            return config_lib.unknown_keys_message(parent or "config", [part], known, owner, moved)
        node, parent = node[part], f"{parent}.{part}".lstrip(".")
    return None


def _known_keys(cfg, parent: str) -> tuple[set | None, str | None]:
    """(the keys section `parent` takes, who says so); (None, None) for a free-form mapping, and
    (set(), None) for a family's section without a family (no experiment)."""
    if parent in ("model", "data", "optim"):  # the family's sections: its dataclasses
        name = OmegaConf.select(cfg, "family", throw_on_missing=False)
        if name is None:
            return set(), None
        cls = family(name).task.config_sections[parent][0]
        return {f.name for f in dataclasses.fields(cls)}, cls.__name__
    cls = OmegaConf.get_type(OmegaConf.select(cfg, parent) if parent else cfg)
    if not dataclasses.is_dataclass(cls):
        return None, None
    names = {f.name for f in dataclasses.fields(cls)}
    return names, ("the top level" if not parent else cls.__name__)


def load_run_config(text: str, overrides=()):
    """A run directory's config.yaml (written by the trainer) with key=value `overrides`
    (`apply_overrides`), checked as `load_config` checks. ConfigError when the text is not a
    mapping of config sections (damaged, hand-edited)."""
    try:
        cfg = OmegaConf.create(text)
    except Exception as e:  # YAML's and OmegaConf's errors
        raise ConfigError(f"does not parse ({one_line(e, 300)})") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError("expected the config.yaml python -m train.main writes (a mapping)")
    try:
        # a run of an older version: its keys that moved since in their places now, and the
        # keys added since at their defaults
        config_lib.move_saved_keys(cfg, _family_moved_keys)
        config_lib.fill_new_keys(cfg)
    except ConfigError:
        raise
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise ConfigError(f"config error: {one_line(e)}") from e
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
    configs/mesh/NAME.yaml, its `platform` ("" where it names none) included (a v4-64 run
    evaluated on one machine: mesh=cpu); the saved model section stays as the run had it. Group overrides other than mesh and `+key` additions are refused: a saved config
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
                # a preset that names no platform is for any devices
                preset = OmegaConf.merge({"platform": ""}, OmegaConf.load(path))
                cfg.mesh = OmegaConf.merge(cfg.mesh, preset)
            else:
                cfg.merge_with(OmegaConf.from_dotlist([o]))
    finally:
        OmegaConf.set_struct(cfg, True)


def validate(cfg) -> None:
    """The trainer's sections (train.config.validate), then the model family's
    (Task.validate_config: model / data / optim). Raises ConfigError."""
    config_lib.validate(cfg, moved_keys(OmegaConf.select(cfg, "family", throw_on_missing=False)))
    family(cfg.family).task.validate_config(cfg)


def moved_keys(name: str | None = None) -> dict[str, str]:
    """Old dotted key -> where it is now: the trainer's (train.config.MOVED) and the family
    `name`'s (Task.moved_keys); without a family that resolves, every registered family's, each
    new place naming its family (a key one family moved is unknown to the others)."""
    out = dict(config_lib.MOVED)
    try:
        out.update(_family_moved_keys(name) if name else {})
    except ConfigError:
        name = None
    if not name:
        for other, fam in families.registered().items():
            for old, new in fam.task.moved_keys.items():
                out.setdefault(old, f"{new} (family {other})")
    return out


def _family_moved_keys(name: str | None) -> dict[str, str]:
    """The family `name`'s Task.moved_keys ({} without a name)."""
    return dict(family(name).task.moved_keys) if name else {}
