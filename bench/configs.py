"""The benchmarks: each names the trainer experiment it measures, JAX and PyTorch alike.

An entry names configs/experiment/<experiment>.yaml plus bench overrides (e.g. nanoGPT bench.py's
12-sequence micro-batch for GPT-2 124M). `resolve()` composes that experiment exactly as
`python -m train.main +experiment=...` does, so the JAX side runs the trainer's own config and the
PyTorch side reads its model/optimiser/batch from the same composed values. An entry that names no
experiment (the tests' micro configs) carries its model, batch, dtype and optimiser fields itself,
and the resolved record says so (`source`).

Model fields use nanoGPT / upstream TRM names, so they feed `GPTConfig`/`TRMConfig` and the
PyTorch references unchanged. `*_tiny` configs are sized for a 2-core CPU; the others are the
real sizes (GPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from train.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    name: str
    family: str  # "gpt" | "trm"
    device: str  # where it is meant to run: "cpu" | "gpu"
    experiment: str | None = None  # configs/experiment/<experiment>.yaml
    overrides: tuple[str, ...] = ()  # Hydra overrides applied on top of the experiment
    # time-to-quality target: (metric, threshold, max_steps) for `python -m bench ttq`
    ttq: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Without an experiment only: GPTConfig / TRMConfig fields, the global batch of one
    # optimiser step, the dtype policy (GPT: params fp32, compute in `dtype`, torch: autocast;
    # TRM: params fp32, forward in model["forward_dtype"]) and the optimiser fields.
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 0
    dtype: str = "float32"
    optim: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def unit(self) -> str:
        return "tokens" if self.family == "gpt" else "examples"


CONFIGS: dict[str, BenchConfig] = {
    c.name: c
    for c in (
        # ---- CPU (tiny) ------------------------------------------------------------------------
        # nanoGPT README's "CPU / MacBook" shakespeare_char variant; its experiment reaches ~2.5
        # after its 300 scheduled steps
        BenchConfig(
            name="gpt_shakespeare_char_tiny",
            family="gpt",
            device="cpu",
            experiment="gpt_shakespeare_char_tiny",
            ttq=dict(metric="val_loss", target=2.6, eval_interval=50, eval_iters=20, max_steps=300),
        ),
        # Sudoku TRM shrunk for a CPU. On the experiment's easy grids (data/sudoku_easy.py: 30
        # blanks per puzzle) the slow tier's test_demo_learns_and_its_accuracy_rises_across_act_steps
        # sees exact accuracy 0 at step 250, 0.19 at step 500 and 0.9 at step 750
        BenchConfig(
            name="trm_sudoku_tiny",
            family="trm",
            device="cpu",
            experiment="trm_sudoku_tiny",
            ttq=dict(metric="exact_accuracy", target=0.3, eval_interval=50, max_steps=800),
        ),
        # ---- GPU (real sizes) ------------------------------------------------------------------
        BenchConfig(
            name="gpt_shakespeare_char",
            family="gpt",
            device="gpu",
            experiment="gpt_shakespeare_char",
            ttq=dict(
                metric="val_loss", target=1.47, eval_interval=250, eval_iters=200, max_steps=5000
            ),
        ),
        # nanoGPT bench.py: 12 x 1024 tokens per step, GPT-2 124M shape, vocab padded to 50304.
        BenchConfig(
            name="gpt2_124m",
            family="gpt",
            device="gpu",
            experiment="gpt2_124m",
            overrides=("trainer.global_batch_size=12",),
        ),
        BenchConfig(
            name="trm_sudoku",
            family="trm",
            device="gpu",
            experiment="trm_sudoku",
            ttq=dict(metric="exact_accuracy", target=0.85, eval_interval=5000, max_steps=65100),
        ),
        BenchConfig(name="trm_sudoku_att", family="trm", device="gpu", experiment="trm_sudoku_att"),
    )
}

CPU_DEFAULT = ("trm_sudoku_tiny", "gpt_shakespeare_char_tiny")
GPU_DEFAULT = ("trm_sudoku", "trm_sudoku_att", "gpt_shakespeare_char", "gpt2_124m")


def get(name: str) -> BenchConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ConfigError(
            f"bench: unknown config {name!r}; known: {', '.join(sorted(CONFIGS))}"
        ) from None


# ----------------------------------------------------------------------------------------------
# Resolution against the trainer's configs

# What every benchmark sets on top of the experiment: one device, no I/O, no accumulation.
_BENCH_TRAINER_OVERRIDES = (
    "mesh=cpu",
    "logging.wandb=disabled",
    "logging.jsonl=false",
    "checkpoint.enabled=false",
    "trainer.progress_bar=false",
)


def _compose_experiment(cfg: BenchConfig, seed: int) -> tuple[dict, str]:
    from omegaconf import OmegaConf

    from train.compose import load_config

    overrides = [f"+experiment={cfg.experiment}", *_BENCH_TRAINER_OVERRIDES, *cfg.overrides]
    overrides.append(f"run.seed={seed}")
    if cfg.family == "gpt":
        overrides.append("data.gradient_accumulation_steps=1")  # as nanoGPT bench.py
    trainer_cfg = OmegaConf.to_container(load_config(overrides), resolve=True)
    return trainer_cfg, f"configs/experiment/{cfg.experiment}.yaml + {' '.join(overrides[1:])}"


def _from_fields(cfg: BenchConfig, seed: int) -> tuple[dict, str]:
    """The trainer config of an entry without an experiment, from its own fields."""
    from omegaconf import OmegaConf

    from train.config import Config

    model, optim = dict(cfg.model), dict(cfg.optim)
    trainer = {"global_batch_size": cfg.batch_size}
    if cfg.family == "gpt":
        model["dtype"] = cfg.dtype
    else:
        trainer["total_steps"] = int(optim.pop("total_steps"))
    fields = {
        "family": cfg.family,
        "run": {"name": f"bench-{cfg.name}", "seed": seed},
        "trainer": trainer,
        "model": model,
        "optim": optim,
        # TRM's data-dependent sizes (the trainer reads them here when no data set is loaded)
        "data": {k: cfg.model[k] for k in _TRM_DATA_FIELDS} if cfg.family == "trm" else {},
    }
    settings = OmegaConf.from_dotlist([o for o in _BENCH_TRAINER_OVERRIDES if "." in o])
    merged = OmegaConf.merge(OmegaConf.structured(Config), fields, settings)  # mesh: cpu defaults
    return OmegaConf.to_container(merged, resolve=True), "bench/configs.py"


_TRM_DATA_FIELDS = ("seq_len", "vocab_size", "num_puzzle_identifiers")


def resolve(
    cfg: BenchConfig,
    *,
    seed: int = 0,
    jax_overrides: dict | None = None,
    data_path: str | None = None,
) -> dict:
    """-> plain dict both sides build from: family, model, optim, batch_size, dtype, the full
    trainer config (`trainer_cfg`, for train.families.make_task) and where it came from (`source`).

    `jax_overrides` are fields changed on the JAX side only: model fields (e.g. scan/remat
    variants) by name, optimiser fields as `optim.NAME` (e.g. optim.table_update). `data_path`
    replaces data.path: the data set whose train split the batches come from
    (bench.runners.make_batch).
    """
    if cfg.experiment:
        trainer_cfg, source = _compose_experiment(cfg, seed)
    else:
        trainer_cfg, source = _from_fields(cfg, seed)
    if data_path:
        trainer_cfg.setdefault("data", {})["path"] = str(data_path)
    jax_overrides = dict(jax_overrides or {})
    optim_overrides = {
        k.removeprefix("optim."): jax_overrides.pop(k) for k in list(jax_overrides)
        if k.startswith("optim.")
    }  # fmt: skip
    jax_overrides = {k.removeprefix("model."): v for k, v in jax_overrides.items()}
    trainer_cfg["optim"] = {**(trainer_cfg.get("optim") or {}), **optim_overrides}
    model = dict(trainer_cfg["model"])
    batch = int(trainer_cfg["trainer"]["global_batch_size"])
    optim = dict(trainer_cfg.get("optim") or {})
    if cfg.family == "gpt":
        dtype = model.get("dtype", "float32")
        # dtype -> autocast on the torch side; the implementation choices are JAX-only (torch
        # picks its SDPA kernel itself and has one cross-entropy)
        jax_only = ("dtype", "attention_impl", "cross_entropy_impl")
        torch_model = {k: v for k, v in model.items() if k not in jax_only}
        items = batch * int(model["block_size"])
    else:
        from models.trm.optim import total_steps

        # the data set's sizes, as the trainer takes them without data on disk (configs/data/)
        t, d = trainer_cfg["trainer"], trainer_cfg.get("data") or {}
        for k in _TRM_DATA_FIELDS:
            model.setdefault(k, int(d[k]))
        dtype = model.get("forward_dtype", "bfloat16")
        torch_model = dict(model)
        items = batch
        # the trainer's schedule length: trainer.total_steps, else upstream's from the epochs
        optim["total_steps"] = int(t.get("total_steps") or 0) or total_steps(
            int(d.get("epochs") or 0),
            int(d.get("total_groups", 1000)),
            float(d.get("mean_puzzle_examples", 1.0)),
            batch,
        )
    jax_model = {**model, **jax_overrides}
    trainer_cfg["model"] = jax_model
    return {
        "config": cfg.name,
        "family": cfg.family,
        "device": cfg.device,
        "model": torch_model,
        "jax_model": jax_model,
        "optim": optim,
        "batch_size": batch,
        "dtype": dtype,
        "unit": cfg.unit,
        "items_per_step": items,
        "trainer_cfg": trainer_cfg,
        "source": source,
        "ttq": dict(cfg.ttq),
    }
