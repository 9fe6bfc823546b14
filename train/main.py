"""Entry point, a Hydra app: `python -m train.main +experiment=NAME [key=value ...]`.

Hydra's own command line works: `--help` (config groups), `--cfg job` (the composed config),
`--info`, and `-m` sweeps (`-m +experiment=NAME optim.lr=1e-4,3e-4`: the basic launcher runs the
jobs one after the other in this process, each in its own run directory `<run.name>-<job num>`).
Hydra writes nothing and does not change directory (configs/config.yaml's `hydra:` section): the
run directory is still <run.out_dir>/<run.name>, decided by the trainer.

Kept short on purpose (Flax examples/gemma style): distributed init, config, compilation cache,
mesh, one call into the trainer. Environment for multi-process runs: JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID (local runs and tests, launch/local.py); on Cloud TPU none are
needed. Every process gets the same argv and composes the same config: no per-process directory.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys

import hydra
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf

from train import config as config_lib
from train.compilation_cache import log_compilation_cache_stats, setup_compilation_cache
from train.compose import load_config, validate
from train.config import ConfigError
from train.distributed import initialize, quiet_tpu_probe
from train.mesh import make_mesh
from train.nonfinite import NonfiniteError
from train.trainer import train

# Flags that make Hydra print, sweep or read another config instead of one plain run.
_HYDRA_FLAGS = ("-", "hydra.", "hydra/")


def _is_plain_run(args: list[str]) -> bool:
    return not any(a.startswith(_HYDRA_FLAGS) for a in args)


_MULTIRUN = ("-m", "--multirun")


def _sweep_jobs(args: list[str]) -> list[list[str]]:
    """The overrides of each job of a plain `-m` sweep, expanded as Hydra's basic sweeper does
    (the product of the comma lists); [] when `args` is no sweep or has other Hydra flags."""
    rest = [a for a in args if a not in _MULTIRUN]
    if len(rest) == len(args) or not _is_plain_run(rest):
        return []
    try:
        overrides = OverridesParser.create().parse_overrides(rest)
        return [
            list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch
        ]
    except HydraException as e:  # OverrideParseException: a grammar error in an override
        raise ConfigError(f"config error: {' '.join(str(e).split())}") from e


def _job_run_name(name: str) -> str:
    """In a sweep (-m), job N's run is `<run.name>-<N>`: two jobs never share a run directory,
    and the same sweep command again resumes each job from its own directory."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return f"{name}-{HydraConfig.get().job.num}"
    return name


# An absolute path: Hydra resolves a relative one against the calling module's package when
# main() is called in-process (tests), where "../configs" is no package.
CONFIG_DIR = str(pathlib.Path(__file__).resolve().parent.parent / "configs")


@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def _run(cfg) -> dict:
    try:
        OmegaConf.set_struct(cfg, True)
        cfg.run.name = _job_run_name(cfg.run.name)
        validate(cfg)  # the same checks as load_config, on the config Hydra composed
        # Process-wide, so here and not in train(): before the first compile, once per process.
        setup_compilation_cache(
            cfg.run.compilation_cache_dir, cfg.run.compilation_cache_min_compile_secs
        )
        try:
            return train(cfg, make_mesh(cfg.mesh))  # raises ConfigError when it cannot resume
        finally:
            log_compilation_cache_stats()  # hits / misses of this process
    except (ConfigError, NonfiniteError) as e:  # NonfiniteError: trainer.on_nonfinite=stop
        _exit_with(e)  # exit status 1, no traceback: it is the user's input


def _exit_with(e: BaseException):
    """One line `error: ...` and exit status 1; HYDRA_FULL_ERROR=1 re-raises for the traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise e
    sys.exit("error: " + " ".join(str(e).split()))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    config_lib.register_schema()  # base_config, before Hydra composes
    try:  # Hydra's own composition errors span several lines; ours are one line
        if _is_plain_run(args):
            load_config(args)
        for n, job in enumerate(_sweep_jobs(args)):  # every job of a sweep, before the first runs
            try:
                load_config(job)
            except ConfigError as e:
                raise ConfigError(f"sweep job {n} ({' '.join(job)}): {e}") from e
    except ConfigError as e:
        _exit_with(e)
    if quiet_tpu_probe():  # before JAX starts a backend
        logging.getLogger(__name__).info("JAX_PLATFORMS=cpu: no TPU or GPU device on this machine")
    initialize()  # before anything touches devices (importing the trainer does not)
    saved, sys.argv = sys.argv, [sys.argv[0], *args]  # Hydra reads its command line there
    try:
        _run()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    # force: importing grain (above) already gave the root logger a handler, which would make
    # basicConfig a no-op and leave it at WARNING
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every file it writes
    # JAX >= 0.12 logs each backend it could not start ('tpu' without libtpu, 'proxy') at INFO;
    # its warnings and errors still show
    logging.getLogger("jax").setLevel(logging.WARNING)
    main()
