"""The configuration schema of the trainer, and its validation.

Hydra composes `configs/config.yaml` + `configs/<group>/*.yaml` + `+experiment=NAME` + command-line
overrides ON TOP OF the dataclasses below (registered in Hydra's ConfigStore as `base_config`), so
an unknown key or a wrongly typed value in any trainer section is rejected by OmegaConf while
composing. `validate` checks the values of those sections. `model`, `data` and `optim` are
free-form mappings whose keys depend on the model family: the family checks them
(its `Task.validate_config`, train/families/<family>/task.py, called by train/compose.py) against
its own config dataclasses (`check_fields`, `build_dataclass`), so a misspelt key fails there,
before any array is created. Every error is a `ConfigError` naming the dotted key and what
was expected. This module knows no model family.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from models.fields import out_of_range
from train import xla_flags
from train.compilation_cache import DEFAULT_DIR, DEFAULT_MIN_COMPILE_SECS
from train.errors import ConfigError

# logging.wandb: off is disabled under the name the `logging=off` group has
WANDB_MODES = ("auto", "online", "offline", "disabled", "off")

# trainer.on_nonfinite: what a step with a non-finite loss or gradient norm does (train/nonfinite.py)
NONFINITE_MODES = ("stop", "skip")

# mesh.platform: the devices a mesh preset is for ("": whatever this process sees)
PLATFORMS = ("", "cpu", "gpu", "tpu")


@dataclass
class RunConfig:
    name: str = MISSING  # deterministic: also the wandb run id, so a resumed run continues it
    out_dir: str = "runs"  # the run directory is <out_dir>/<name>
    seed: int = 0
    resume: bool = True  # resume automatically from the latest checkpoint in the run directory
    # Persistent XLA compilation cache (train/compilation_cache.py): a later process that builds the
    # same program loads it instead of compiling. Local dir or gs://...; empty or null = off. Your
    # own JAX_COMPILATION_CACHE_DIR, if set, wins over it.
    compilation_cache_dir: str | None = DEFAULT_DIR
    compilation_cache_min_compile_secs: float = DEFAULT_MIN_COMPILE_SECS  # faster ones: not saved
    # A bucket run directory's one-writer lease (train/rundir.py): a trainer that has not renewed
    # it for this long (a killed job, a lost VM) loses the run directory to the next one.
    lease_ttl_s: float = 120.0
    # XLA compiler flags for the run's process, e.g. "--xla_gpu_enable_triton_gemm=false"
    # (train/xla_flags.py): set before the backend starts; your own XLA_FLAGS win a repeated flag.
    xla_flags: str = ""
    # Keep the CPU step's temporary buffer in the heap from step to step (glibc malloc: one arena,
    # no mmap; train.runtime.keep_cpu_step_buffers): the step of a model whose temporaries pass
    # 64 MB runs up to 2x faster, compiling takes ~1-3 s longer, and the process keeps the memory
    # it freed. Only with a CPU backend; for runs of thousands of steps (the CPU experiments).
    cpu_heap: bool = False


@dataclass
class TrainerConfig:
    global_batch_size: int = MISSING  # rows of one (micro-)batch over all processes
    # Stop after this many optimiser steps. 0 = the family derives it from its own schedule
    # (TRM: data.epochs x examples / batch, as upstream; GPT: max_iters + 1, as nanoGPT's loop).
    total_steps: int = 0
    # If > 0, stop at this step with the schedule unchanged (the start of a long run; a rerun
    # with a larger value continues it).
    max_steps: int = 0
    eval_interval: int = 0  # steps between evaluations (0 = only at the end)
    log_interval: int = 10
    # scratch | a weights file of the family's original code base (its Task.import_weights)
    init_from: str = "scratch"
    eval_at_start: bool = False
    progress_bar: bool = True  # tqdm, only on an interactive terminal
    # A non-finite loss or gradient norm (checked inside the step): stop = error naming the step and
    # the last good checkpoint; skip = the update is not applied, the event counted and logged.
    on_nonfinite: str = "stop"
    # > 0: trace steps profile_start .. profile_start + profile_steps - 1 with jax.profiler into
    # <run dir>/profile (train/profiling.py); 0 = off.
    profile_start: int = 0
    profile_steps: int = 3


@dataclass
class MeshConfig:
    # Degrees of the three mesh axes; one may be -1 = "all remaining devices".
    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    # Auto (GSPMD propagation, MaxText's default) or explicit (sharding in types; needs
    # out_sharding on every op). The trainer is written for auto; see docs/training.md.
    axis_types: str = "auto"
    # replicate: every device holds all params (pure data parallel over data x fsdp);
    # fsdp: each param is split over the fsdp axis along its largest divisible dimension.
    param_sharding: str = "replicate"
    # Logical axis -> mesh axes, first match wins (MaxText style). `batch` shards the global batch
    # and the TRM carry; it is the only logical axis the trainer reads (params follow
    # param_sharding).
    rules: list[Any] = field(default_factory=lambda: [["batch", ["data", "fsdp"]]])
    # The devices this preset is for (PLATFORMS; configs/mesh/v4-64.yaml: tpu). A family's
    # defaults for that platform (Task.platform_defaults, e.g. TRM's float32 loss on a TPU) replace
    # its dataclass defaults; "" = whatever devices this process sees, the dataclass defaults.
    platform: str = ""


@dataclass
class LoggingConfig:
    # auto (online with an API key, else offline) | online | offline | disabled (or off)
    wandb: str = "auto"
    project: str = "trm-jax-port"
    jsonl: bool = True  # <run dir>/metrics.jsonl, always written by process 0 unless disabled


@dataclass
class CheckpointConfig:
    interval: int = 0  # steps between checkpoints (0 = at every eval and at the end)
    keep_last: int = 2
    keep_best: bool = True  # also keep the best checkpoint by `best_metric`
    best_metric: str = ""  # e.g. eval/val_loss (GPT) or eval/all/exact_accuracy (TRM)
    best_mode: str = "min"  # min | max
    async_save: bool = True
    enabled: bool = True


@dataclass
class Config:
    # The model family: a name of train/families/__init__.py's FAMILIES (gpt, trm), or the module
    # path of a family package (docs/architecture.md, "Adding a model family").
    family: str = MISSING
    run: RunConfig = field(default_factory=RunConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # The family's sections, checked by its Task.validate_config:
    model: dict[str, Any] = field(default_factory=dict)  # its model config (GPTConfig, TRMConfig)
    data: dict[str, Any] = field(default_factory=dict)
    optim: dict[str, Any] = field(default_factory=dict)  # its optimiser config


# Keys that moved, by their old dotted name -> where each is now: the trainer's own here; a
# family's knobs that left the trainer section are its Task.moved_keys. An old key given now is
# one line naming the new one (`unknown_keys_message`); a saved config.yaml (a run directory of
# an older version) is read with it moved (`move_saved_keys`).
MOVED = {"task": "family"}
# Keys of the trainer section an older version wrote that a family reads in its own section now
# (its Task.moved_keys says where); a saved config of a family that never read one drops it.
FORMER_TRAINER_KEYS = (
    "trainer.epochs",
    "trainer.eval_iters",
    "trainer.gradient_accumulation_steps",
)


def moved_key_message(old: str, new: str) -> str:
    """One line: `old` is a key that moved, and where it is now."""
    return f"{old}: moved to {new}"


def move_saved_keys(cfg: DictConfig, family_moved) -> None:
    """A saved config (a run directory's config.yaml, `cfg` not in struct mode) with the keys an
    older version wrote in their places now, in place: MOVED's (the family's name), then
    `family_moved(family_name)` (the family's Task.moved_keys) for FORMER_TRAINER_KEYS; a former
    trainer key the family does not take is dropped (the family never read it). A key already in
    its new place is kept."""
    for old, new in MOVED.items():
        if old in cfg and new not in cfg:
            cfg[new] = cfg[old]
        cfg.pop(old, None)
    if not isinstance(cfg.get("trainer"), DictConfig):
        return
    former = [k for k in FORMER_TRAINER_KEYS if k.partition(".")[2] in cfg.trainer]
    moved = family_moved(cfg.get("family")) if former else {}
    for old in former:
        value = OmegaConf.select(cfg, old)
        new = moved.get(old)
        if new is not None and OmegaConf.select(cfg, new, default=None) is None:
            OmegaConf.update(cfg, new, value, force_add=True)
        cfg.trainer.pop(old.partition(".")[2])


def section_defaults(cls, exclude=()) -> dict:
    """The defaults of dataclass `cls`'s fields but `exclude`, as a plain mapping (a config node)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        has_factory = f.default_factory is not dataclasses.MISSING
        out[f.name] = f.default_factory() if has_factory else f.default
    return out


def fill_new_keys(cfg: DictConfig) -> None:
    """Gives a saved config (a run directory's config.yaml) the keys of the trainer's own sections
    that it lacks, at their defaults, in place (`cfg` not in struct mode): a run written before a
    key existed ran as its default does. ConfigError when a whole section is missing (not a
    config the trainer wrote)."""
    for f in dataclasses.fields(Config):
        if f.default_factory is dataclasses.MISSING:
            continue
        default = f.default_factory()
        if not dataclasses.is_dataclass(default):
            continue
        if f.name not in cfg:
            raise ConfigError(
                f"no {f.name!r} section; expected the config.yaml python -m train.main writes"
            )
        section = cfg[f.name]
        if not isinstance(section, DictConfig):
            raise ConfigError(f"{f.name}: expected a section of keys, got {section!r:.60}")
        for key, value in section_defaults(type(default)).items():
            if key not in section:
                section[key] = value


def register_schema() -> None:
    """Registers `Config` as `base_config` in Hydra's ConfigStore (configs/config.yaml extends it)."""
    ConfigStore.instance().store(name="base_config", node=Config)


def unknown_keys_message(where: str, unknown, known, owner: str, moved=None) -> str:
    """One line: the unknown key(s) of a section, a close match for each, and the known ones; a
    key that moved (`moved`: old dotted key -> new, default MOVED) is the line naming its place."""
    moved = MOVED if moved is None else moved
    for key in unknown:
        dotted = str(key) if where == "config" else f"{where}.{key}"
        if dotted in moved:
            return moved_key_message(dotted, moved[dotted])
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), sorted(known), n=1)
        if close:
            hints.append(f"{key!r} -> did you mean {close[0]!r}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return f"{where}: unknown key(s) {sorted(unknown)}{hint}; {owner} accepts {sorted(known)}"


def _type_name(tp) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(typing.get_origin(tp) or tp, "__name__", str(tp))


def _type_ok(value, tp) -> bool:
    """Whether a composed config value has the field's annotated type (int accepted for float;
    a bool is never an int or a float here)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp in (list, tuple) or origin in (list, tuple):
        return isinstance(value, list | tuple | ListConfig)
    if tp is dict or origin is dict:
        return isinstance(value, dict | DictConfig)
    return True  # any other annotation: the dataclass checks it itself


def check_fields(cls, mapping, where: str) -> None:
    """ConfigError unless every key of `mapping` is a field of dataclass `cls` and every value
    has the field's annotated type (one line naming the key, the value and the type)."""
    mapping = dict(mapping or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - names)
    if unknown:
        raise ConfigError(unknown_keys_message(where, unknown, names, cls.__name__))
    for key, value in mapping.items():
        if not _type_ok(value, hints[key]):
            raise ConfigError(
                f"{where}.{key}={value!r}: expected {_type_name(hints[key])} "
                f"(got {type(value).__name__})"
            )


def build_dataclass(cls, mapping, where: str):
    """`cls(**mapping)` with errors that name the config section and the bad key or value."""
    check_fields(cls, mapping, where)
    mapping = dict(mapping or {})
    try:
        return cls(**mapping)
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"{where}: {cls.__name__}({mapping}) failed: {e}") from e


def check_ranges(mapping, where: str, cls) -> None:
    """ConfigError for the first field of dataclass `cls` whose value in `mapping` is out of the
    range its metadata states (models.fields.ranged); keys absent from `mapping` are not checked."""
    values = mapping if hasattr(mapping, "get") else vars(mapping)
    bad = out_of_range(values, cls)
    if bad is not None:
        key, text, value = bad
        raise ConfigError(f"{where}.{key} must be {text}, got {value!r}")


def _positive(value, where: str, allow_zero: bool = False):
    if not isinstance(value, int | float) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{where} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def validate(cfg: DictConfig, moved=None) -> None:
    """Checks every value of the trainer's own sections; raises ConfigError before any compute.
    `moved`: the keys that moved (default MOVED; train/compose.py adds the family's).

    The family's sections (model / data / optim) are checked by its Task.validate_config.
    """
    _check_known_keys(cfg, moved)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(
            f"missing value(s) for {missing}; did you forget +experiment=NAME (configs/experiment/)?"
        )
    plain_name(cfg.run.name, "run.name", "the run directory's name under run.out_dir")
    _positive(cfg.run.lease_ttl_s, "run.lease_ttl_s")
    _positive(
        cfg.run.compilation_cache_min_compile_secs,
        "run.compilation_cache_min_compile_secs",
        allow_zero=True,
    )
    xla_flags.parse(cfg.run.xla_flags)
    _check_trainer(cfg.trainer)
    _check_mesh(cfg.mesh)
    if cfg.logging.wandb not in WANDB_MODES:
        raise ConfigError(
            f"logging.wandb must be {'|'.join(WANDB_MODES)}, got {cfg.logging.wandb!r}"
        )
    c = cfg.checkpoint
    _positive(c.interval, "checkpoint.interval", allow_zero=True)
    _positive(c.keep_last, "checkpoint.keep_last")
    if c.best_mode not in ("min", "max"):
        raise ConfigError(f"checkpoint.best_mode must be min or max, got {c.best_mode!r}")


def plain_name(name, key: str, what: str) -> None:
    """ConfigError unless `name` is one plain path component: a name joined under a directory
    the user gave stays in it (no separator, no `..`, not empty)."""
    text = str(name)
    if text in ("", ".", "..") or any(c in text for c in "/\\\0"):
        raise ConfigError(
            f"{key}={text!r}: expected a plain name ({what}): not empty, no '/' or '\\', "
            "not '.' or '..'"
        )


_SECTIONS = (
    ("run", RunConfig),
    ("trainer", TrainerConfig),
    ("mesh", MeshConfig),
    ("logging", LoggingConfig),
    ("checkpoint", CheckpointConfig),
)


def _check_known_keys(cfg, moved=None) -> None:
    # `+key=value` on the command line force-adds keys even to structured nodes: check them here.
    sections = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(cfg.keys()) - sections)
    if unknown:
        raise ConfigError(unknown_keys_message("config", unknown, sections, "the top level", moved))
    for name, cls in _SECTIONS:
        names = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(cfg[name].keys()) - names)
        if extra:
            raise ConfigError(unknown_keys_message(name, extra, names, cls.__name__, moved))


def _check_trainer(t) -> None:
    _positive(t.global_batch_size, "trainer.global_batch_size")
    _positive(t.log_interval, "trainer.log_interval")
    _positive(t.profile_steps, "trainer.profile_steps")
    for key in ("total_steps", "max_steps", "eval_interval", "profile_start"):
        _positive(t[key], f"trainer.{key}", allow_zero=True)
    if t.on_nonfinite not in NONFINITE_MODES:
        raise ConfigError(
            f"trainer.on_nonfinite must be one of {'|'.join(NONFINITE_MODES)}, "
            f"got {t.on_nonfinite!r}"
        )


def _check_mesh(m) -> None:
    sizes = [m.data, m.fsdp, m.tensor]
    if sum(s == -1 for s in sizes) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ConfigError(f"mesh: degrees must be >= 1 with at most one -1, got {sizes}")
    if m.axis_types not in ("auto", "explicit"):
        raise ConfigError(f"mesh.axis_types must be auto or explicit, got {m.axis_types!r}")
    if m.param_sharding not in ("replicate", "fsdp"):
        raise ConfigError(
            f"mesh.param_sharding must be replicate or fsdp, got {m.param_sharding!r}"
        )
    if m.platform not in PLATFORMS:
        raise ConfigError(f"mesh.platform must be tpu, gpu, cpu or '' (any), got {m.platform!r}")
    for i, rule in enumerate(m.rules):
        if len(rule) != 2 or not isinstance(rule[0], str):
            raise ConfigError(f"mesh.rules[{i}] must be [logical_name, mesh_axes], got {rule}")
