"""`python -m train.main +experiment=NAME [key=value ...] --info`: what the run would do, in a few
lines, from its composed and validated config; nothing is built, compiled or written. Hydra's own
information (plugins, search path, defaults) is `--info all` (or one of its topics).

    experiment  trm_sudoku_tiny (configs/experiment/trm_sudoku_tiny.yaml)
    family      trm: model TRMConfig, data TRMDataConfig, optim TRMOptimConfig
    mesh        cpu: data 1 x fsdp -1 x tensor 1 (-1: the devices left), params replicate
    data        data_out/sudoku-tiny-30m: built on first use by data.build=sudoku_easy
    steps       data.epochs=320 over the data set at batch 32: counted once the data set is built
    writes      runs/trm_sudoku_tiny: config.yaml, metrics.jsonl, final.json, checkpoints/
    logging     metrics.jsonl; wandb disabled
"""

from __future__ import annotations

from etils import epath
from omegaconf import OmegaConf

from train.compose import compose, load_config
from train.families import family

# Hydra's own --info topics: `--info TOPIC` is Hydra's, a bare `--info` this module's
HYDRA_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def info_overrides(args: list[str]) -> list[str] | None:
    """The overrides of a command line that asks for this summary (`--info` or `-i` without a
    topic, every other argument an override), else None."""
    flags = [i for i, a in enumerate(args) if a in ("--info", "-i")]
    if len(flags) != 1:
        return None
    i = flags[0]
    if i + 1 < len(args) and args[i + 1] in HYDRA_TOPICS:
        return None
    rest = args[:i] + args[i + 1 :]
    if any(a.startswith(("-", "hydra.", "hydra/")) for a in rest):
        return None
    return rest


def describe(overrides: list[str]) -> list[str]:
    """The summary's lines (ConfigError: the config's one line, as the run would say it)."""
    cfg = load_config(overrides)
    choices = compose(overrides, hydra_config=True).hydra.runtime.choices
    task = family(cfg.family).task
    experiment = choices.get("experiment")
    sections = ", ".join(f"{k} {c.__name__}" for k, (c, _) in task.config_sections.items())
    m = cfg.mesh
    run_dir = epath.Path(cfg.run.out_dir) / cfg.run.name
    resumes = ""
    if "://" not in str(run_dir) and (run_dir / "checkpoints").exists():
        resumes = " (holds checkpoints: the run resumes from the newest)"
    wandb = cfg.logging.wandb
    lines = [
        f"experiment  {experiment} (configs/experiment/{experiment}.yaml)"
        if experiment
        else "experiment  none (the config's own values)",
        f"family      {cfg.family}" + (f": {sections}" if sections else ""),
        f"mesh        {choices.get('mesh')}: data {m.data} x fsdp {m.fsdp} x tensor {m.tensor} "
        f"(-1: the devices left), params {m.param_sharding}",
        f"data        {_data(cfg.data)}",
        f"steps       {task.planned_steps(cfg)}"
        + (
            f"; stops at trainer.max_steps={cfg.trainer.max_steps}" if cfg.trainer.max_steps else ""
        ),
        f"writes      {run_dir}: config.yaml, metrics.jsonl, final.json, checkpoints/{resumes}",
        "logging     " + ("metrics.jsonl; " if cfg.logging.jsonl else "") + f"wandb {wandb}",
    ]
    return lines


def _data(d) -> str:
    d = OmegaConf.to_container(d)
    path, build = d.get("path", ""), d.get("build")
    if not path:
        return "no data.path"
    if "://" not in path and epath.Path(path).exists():
        return f"{path}: on disk"
    if build:
        return f"{path}: built on first use by data.build={build}"
    return f"{path}: not on disk (build it first; configs/data/)"
