"""Entry point: `python -m train.main +experiment=NAME [key=value ...]`.

A plain run composes its config once with Hydra's compose API (train/compose.py), validates it
once, and calls the trainer. Hydra's own command line works too, through `@hydra.main`: `--help`
(config groups), `--cfg job` (the composed config), `--info TOPIC` (a bare `--info` is
train/info.py's summary of the run), `hydra.*` overrides, and `-m` sweeps (`-m +experiment=NAME
optim.lr=1e-4,3e-4`: Hydra's basic launcher runs the jobs one after the other in this process,
each in its own run directory `<run.name>-<job num>`). Such a command line's overrides are
composed as a plain run's first, so a bad one is the same one line. Before a sweep
starts, every job's config is composed and validated, so a bad value in the last job is one line
before the first job runs. Hydra writes nothing but a sweep's multirun.yaml and does not change
directory (configs/config.yaml's `hydra:` section).

Kept short on purpose (Flax examples/gemma style): config, XLA flags (run.xla_flags, before any
backend starts), distributed init, compilation cache, mesh, one call into the trainer. Environment
for multi-process runs: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID (local runs
and tests, launch/local.py); on Cloud TPU none are needed. Every process gets the same argv and
composes the same config: no per-process directory.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import sys

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf

from train import gcs, xla_flags
from train.compilation_cache import log_compilation_cache_stats, setup_compilation_cache
from train.compose import (
    CONFIG_DIR,
    compose,
    load_config,
    register_schema,
    resolve_family_sections,
    validate,
)
from train.distributed import initialize
from train.errors import (
    EXIT_DISK_FULL,
    ConfigError,
    DiskFullError,
    exit_with,
    is_disk_full,
    one_line,
)
from train.info import describe, info_overrides
from train.memory import out_of_memory_line
from train.mesh import make_mesh
from train.nonfinite import NonfiniteError
from train.preemption import EXIT_PREEMPTED, Preempted
from train.runtime import keep_cpu_step_buffers, quiet_tpu_probe
from train.trainer import run_dir_of, train

_MULTIRUN = ("-m", "--multirun")


def _is_plain(args: list[str]) -> bool:
    """Only overrides: no Hydra flag (`--help`, `-m`, ...) and no `hydra.*` / `hydra/*` key."""
    return not any(a.startswith(("-", "hydra.", "hydra/")) for a in args)


def sweep_jobs(args: list[str]) -> list[list[str]]:
    """The overrides of each job of a `-m` sweep of plain overrides, the product of the comma
    lists as Hydra's basic sweeper forms it; [] when `args` is no such sweep."""
    rest = [a for a in args if a not in _MULTIRUN]
    if len(rest) == len(args) or not _is_plain(rest):
        return []
    try:
        overrides = OverridesParser.create().parse_overrides(rest)
    except HydraException as e:  # OverrideParseException: a grammar error in an override
        raise ConfigError(f"config error: {one_line(e)}") from e
    choices = {}  # key -> ["key=value", ...]; a key given twice keeps its last value
    for o in overrides:
        key = o.get_key_element()
        if not o.is_sweep_override():
            choices[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            choices[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            raise ConfigError(f"{key}: only comma lists sweep here (got {o.value_type.name})")
    return [list(job) for job in itertools.product(*choices.values())]


def check_hydra_overrides(args: list[str]) -> None:
    """Composes the overrides of a command line for Hydra's own app (`--cfg job`, `hydra.*` keys)
    as a plain run does, so a bad key or value is the plain run's one line (ConfigError) instead
    of Hydra's block; a line Hydra parses otherwise (a sweep, another config directory, its help)
    is left to Hydra."""
    if "--version" in args:  # argparse would print it here, and Hydra again
        return
    with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage on a line Hydra refuses
        try:
            a, _ = get_args_parser().parse_known_args(args)
        except SystemExit:
            return
    if a.help or a.hydra_help or a.multirun or a.shell_completion or a.experimental_rerun:
        return
    if a.config_path or a.config_name or a.config_dir:
        return
    compose(a.overrides, hydra_config=True)


@contextlib.contextmanager
def one_run(cfg):
    """The process around one run of the app (a plain run, or one job of a sweep): the
    compilation cache (process-wide, so here, before the first compile), and the run's failures
    as one line and an exit status instead of a traceback. The body calls train.trainer.train."""
    try:
        setup_compilation_cache(
            cfg.run.compilation_cache_dir, cfg.run.compilation_cache_min_compile_secs
        )
    except ConfigError as e:
        exit_with(e)
    try:
        yield
    except BaseException as e:
        log_compilation_cache_stats()  # hits / misses, before the line that says how it ended
        _exit_in_one_line(e, cfg)
        raise
    log_compilation_cache_stats()


def _exit_in_one_line(e: BaseException, cfg) -> None:
    """Exits with the one line and status of a failure the run reports so; returns otherwise."""
    if isinstance(e, ConfigError | NonfiniteError):  # NonfiniteError: trainer.on_nonfinite=stop
        exit_with(e)  # exit status 1, no traceback: it is the user's input (or cannot resume)
    oom = out_of_memory_line(e)
    if oom is not None:  # XLA's: a batch or model the state check could not rule out
        exit_with(ConfigError(oom))
    if isinstance(e, Preempted):  # SIGTERM / SIGINT: the step reached is committed
        print(e, file=sys.stderr, flush=True)
        sys.exit(EXIT_PREEMPTED)
    if isinstance(e, DiskFullError | OSError | ValueError):  # the last checkpoint is intact
        if not is_disk_full(e):
            gcs.exit_if_unreachable(e, run_dir_of(cfg))  # a bucket that stopped answering
            return
        if not isinstance(e, DiskFullError):  # a write outside the trainer's own (a data build)
            e = DiskFullError(e.filename or cfg.run.out_dir)
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_DISK_FULL)


@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def _hydra_app(cfg) -> dict:
    """A run composed by Hydra's own command line (a flag, a hydra.* key, a -m sweep)."""
    try:
        OmegaConf.set_struct(cfg, True)
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            # job N of a sweep: <run.name>-<N>, so two jobs never share a run directory and the
            # same sweep again resumes each job from its own
            cfg.run.name = f"{cfg.run.name}-{HydraConfig.get().job.num}"
        resolve_family_sections(cfg)  # as compose does: the platform defaults become values
        validate(cfg)
        xla_flags.apply(cfg.run.xla_flags)  # a no-op when main() applied the same ones
    except ConfigError as e:
        exit_with(e)
    with one_run(cfg):
        return train(cfg, make_mesh(cfg.mesh))


def main(argv: list[str] | None = None) -> None:
    gcs.configure()  # STORAGE_EMULATOR_HOST set: every gs:// client goes to that server
    args = sys.argv[1:] if argv is None else list(argv)
    register_schema()  # base_config and the families' defaults, before anything composes
    cfg, cpu_heap = None, []
    info = info_overrides(args)
    if info is not None:  # `--info` without a topic: what the run would do (train/info.py)
        try:
            print("\n".join(describe(info)))
        except ConfigError as e:
            exit_with(e)
        return
    try:  # Hydra's own composition errors span several lines; ours are one line
        if _is_plain(args):
            cfg = load_config(args)
            xla_flags.apply(cfg.run.xla_flags)  # before any backend starts (make_mesh)
            cpu_heap.append(cfg.run.cpu_heap)
        for n, job in enumerate(sweep_jobs(args)):  # every job of a sweep, before the first runs
            try:
                # the jobs share this process, which reads XLA flags once: all must agree
                job_cfg = load_config(job)
                xla_flags.apply(job_cfg.run.xla_flags)
                cpu_heap.append(job_cfg.run.cpu_heap)
            except ConfigError as e:
                raise ConfigError(f"sweep job {n} ({' '.join(job)}): {e}") from e
        if not _is_plain(args):
            check_hydra_overrides(args)
    except ConfigError as e:
        exit_with(e)
    xla_flags.log_applied()
    log = logging.getLogger(__name__)
    if quiet_tpu_probe():  # before JAX starts a backend
        log.info("JAX_PLATFORMS=cpu: no TPU or GPU device on this machine")
    if cpu_heap and all(cpu_heap) and keep_cpu_step_buffers():  # as well, before the backend
        log.info("run.cpu_heap: the CPU step's buffers stay in the heap (one malloc arena)")
    initialize()  # before anything touches devices (importing the trainer does not)
    if cfg is not None:
        with one_run(cfg):
            train(cfg, make_mesh(cfg.mesh))
        return
    if any(a in ("--info", "-i") or a.startswith("--info=") for a in args):
        # Hydra's --info gives the root logger a stdout handler of its own: ours would print
        # every line a second time
        logging.getLogger().handlers.clear()
    saved, sys.argv = sys.argv, [sys.argv[0], *args]  # Hydra reads its command line there
    try:
        _hydra_app()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    # force: importing grain (above) already gave the root logger a handler, which would make
    # basicConfig a no-op and leave it at WARNING
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every file it writes
    logging.getLogger("fsspec").setLevel(logging.WARNING)  # gcsfs logs every file it reads
    # JAX >= 0.12 logs each backend it could not start ('tpu' without libtpu, 'proxy') at INFO;
    # its warnings and errors still show
    logging.getLogger("jax").setLevel(logging.WARNING)
    main()
