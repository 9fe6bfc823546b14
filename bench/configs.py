"""The model/batch/optimiser settings each benchmark runs, JAX and PyTorch alike.

Each entry names the trainer experiment it measures (configs/experiment/<experiment>.yaml) plus
bench overrides (e.g. nanoGPT bench.py's 12-sequence micro-batch for GPT-2 124M). `resolve()`
composes that experiment exactly as `python -m train.main +experiment=...` does, so the JAX side
runs the trainer's own config and the PyTorch side reads its model/optimiser/batch from the same
composed values. An entry that names no experiment (gpt_shakespeare_char), or whose experiment
file is missing, uses the fields written here instead, and the resolved record says so (`source`).

Model fields use nanoGPT / upstream TRM names, so they feed `GPTConfig`/`TRMConfig` and the
PyTorch references unchanged. `*_tiny` configs are sized for a 2-core CPU; the others are the
real sizes (GPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    name: str
    family: str  # "gpt" | "trm"
    device: str  # where it is meant to run: "cpu" | "gpu"
    model: dict[str, Any]  # GPTConfig / TRMConfig fields
    batch_size: int  # global batch of one optimiser step
    # dtype policy. GPT: params fp32, compute in `dtype` (torch: autocast). TRM: params fp32,
    # forward in model["forward_dtype"] (upstream casts weights to it inside each layer).
    dtype: str
    optim: dict[str, Any]
    # time-to-quality target: (metric, threshold, max_steps) for `python -m bench ttq`
    ttq: dict[str, Any] = dataclasses.field(default_factory=dict)
    experiment: str | None = None  # configs/experiment/<experiment>.yaml
    overrides: tuple[str, ...] = ()  # Hydra overrides applied on top of the experiment

    @property
    def unit(self) -> str:
        return "tokens" if self.family == "gpt" else "examples"

    @property
    def items_per_step(self) -> int:
        if self.family == "gpt":
            return self.batch_size * self.model["block_size"]
        return self.batch_size


# nanoGPT config/train_shakespeare_char.py (+ train.py defaults for what it does not set)
_GPT_CHAR_OPTIM = dict(
    learning_rate=1e-3,
    min_lr=1e-4,
    warmup_iters=100,
    lr_decay_iters=5000,
    max_iters=5000,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.99,
    grad_clip=1.0,
    decay_lr=True,
)

# upstream README Sudoku command: lr 1e-4, puzzle_emb_lr 1e-4, both weight decays 1.0, EMA 0.999
_TRM_SUDOKU_OPTIM = dict(
    lr=1e-4,
    lr_min_ratio=1.0,
    lr_warmup_steps=2000,
    puzzle_emb_lr=1e-4,
    weight_decay=1.0,
    puzzle_emb_weight_decay=1.0,
    beta1=0.9,
    beta2=0.95,
    ema=True,
    ema_rate=0.999,
    total_steps=65100,
)

_TRM_SUDOKU_MODEL = dict(
    seq_len=81,
    vocab_size=11,
    num_puzzle_identifiers=1,
    puzzle_emb_ndim=512,
    puzzle_emb_len=16,
    hidden_size=512,
    num_heads=8,
    expansion=4,
    H_cycles=3,
    L_cycles=6,
    L_layers=2,
    halt_max_steps=16,
    halt_exploration_prob=0.1,
    forward_dtype="bfloat16",
)

CONFIGS: dict[str, BenchConfig] = {}


def _add(cfg: BenchConfig) -> None:
    CONFIGS[cfg.name] = cfg


# ---- CPU (tiny) -------------------------------------------------------------------------------
# nanoGPT README's "CPU / MacBook" shakespeare_char variant (block 64, batch 12, 4x4x128, no
# dropout, 2000 iterations).
_add(
    BenchConfig(
        name="gpt_shakespeare_char_tiny",
        family="gpt",
        device="cpu",
        model=dict(
            block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False
        ),
        batch_size=12,
        dtype="float32",
        optim={**_GPT_CHAR_OPTIM, "lr_decay_iters": 300, "max_iters": 300, "warmup_iters": 20},
        # configs/experiment/gpt_shakespeare_char_tiny.yaml: ~2.5 after its 300 scheduled steps
        ttq=dict(metric="val_loss", target=2.6, eval_interval=50, eval_iters=20, max_steps=300),
        experiment="gpt_shakespeare_char_tiny",
    )
)
# Sudoku TRM shrunk for a CPU (mirrors configs/experiment/trm_sudoku_tiny.yaml): the same
# recursion shape (mlp_t, no positions) with width 32, one layer, fewer cycles, batch 32.
_add(
    BenchConfig(
        name="trm_sudoku_tiny",
        family="trm",
        device="cpu",
        model={
            **_TRM_SUDOKU_MODEL,
            "hidden_size": 32,
            "puzzle_emb_ndim": 32,
            "puzzle_emb_len": 1,
            "L_layers": 1,
            "H_cycles": 2,
            "L_cycles": 2,
            "halt_max_steps": 4,
            "mlp_t": True,
            "pos_encodings": "none",
            "forward_dtype": "float32",
        },
        batch_size=32,
        dtype="float32",
        optim={
            **_TRM_SUDOKU_OPTIM,
            "lr": 1e-3,
            "puzzle_emb_lr": 1e-3,
            "lr_warmup_steps": 50,
            "weight_decay": 0.1,
            "puzzle_emb_weight_decay": 0.1,
            "ema_rate": 0.99,
            "total_steps": 5000,
        },
        # on the experiment's easy grids (train/tiny_data.py: 8 blanks per puzzle); the trainer's
        # test_trm_sudoku_tiny_learns sees exact accuracy 0 at step 250 and > 0.3 by step 500
        ttq=dict(metric="exact_accuracy", target=0.3, eval_interval=50, max_steps=800),
        experiment="trm_sudoku_tiny",
    )
)

# ---- GPU (real sizes) -------------------------------------------------------------------------
_add(
    BenchConfig(
        name="gpt_shakespeare_char",
        family="gpt",
        device="gpu",
        model=dict(
            block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False
        ),
        batch_size=64,
        dtype="bfloat16",
        optim=_GPT_CHAR_OPTIM,
        ttq=dict(metric="val_loss", target=1.47, eval_interval=250, eval_iters=200, max_steps=5000),
    )
)
# nanoGPT bench.py: 12 x 1024 tokens per step, GPT-2 124M shape, vocab padded to 50304.
_add(
    BenchConfig(
        name="gpt2_124m",
        family="gpt",
        device="gpu",
        model=dict(
            block_size=1024,
            vocab_size=50304,
            n_layer=12,
            n_head=12,
            n_embd=768,
            dropout=0.0,
            bias=False,
        ),
        batch_size=12,
        dtype="bfloat16",
        optim=dict(
            learning_rate=6e-4,
            min_lr=6e-5,
            warmup_iters=2000,
            lr_decay_iters=600000,
            max_iters=600000,
            weight_decay=0.1,
            beta1=0.9,
            beta2=0.95,
            grad_clip=1.0,
            decay_lr=True,
        ),
        experiment="gpt2_124m",
        overrides=("trainer.global_batch_size=12",),
    )
)
_add(
    BenchConfig(
        name="trm_sudoku",
        family="trm",
        device="gpu",
        model={**_TRM_SUDOKU_MODEL, "mlp_t": True, "pos_encodings": "none"},
        batch_size=768,
        dtype="bfloat16",
        optim=_TRM_SUDOKU_OPTIM,
        ttq=dict(metric="exact_accuracy", target=0.85, eval_interval=5000, max_steps=65100),
        experiment="trm_sudoku",
    )
)
_add(
    BenchConfig(
        name="trm_sudoku_att",
        family="trm",
        device="gpu",
        model={**_TRM_SUDOKU_MODEL, "mlp_t": False, "pos_encodings": "rope"},
        batch_size=768,
        dtype="bfloat16",
        optim=_TRM_SUDOKU_OPTIM,
        experiment="trm_sudoku_att",
    )
)

CPU_DEFAULT = ("trm_sudoku_tiny", "gpt_shakespeare_char_tiny")
GPU_DEFAULT = ("trm_sudoku", "trm_sudoku_att", "gpt_shakespeare_char", "gpt2_124m")


def get(name: str) -> BenchConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"bench: unknown config {name!r}; known: {sorted(CONFIGS)}") from None


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


def _experiment_path(name: str) -> str:
    import os

    from train.compose import CONFIG_DIR

    return os.path.join(CONFIG_DIR, "experiment", f"{name}.yaml")


def _fallback_trainer_cfg(cfg: BenchConfig, seed: int) -> dict:
    """The trainer config built from this file's fields (when the experiment yaml is missing)."""
    model = dict(cfg.model)
    if cfg.family == "gpt":
        model["dtype"] = cfg.dtype
    optim = dict(cfg.optim)
    trainer = {"global_batch_size": cfg.batch_size, "progress_bar": False}
    if cfg.family == "trm":
        trainer["total_steps"] = int(optim.pop("total_steps"))
    else:
        trainer["gradient_accumulation_steps"] = 1
    return {
        "task": cfg.family,
        "run": {"name": f"bench-{cfg.name}", "seed": seed},
        "trainer": trainer,
        "mesh": {
            "data": 1,
            "fsdp": -1,
            "tensor": 1,
            "axis_types": "auto",
            "param_sharding": "replicate",
        },
        "logging": {"wandb": "disabled", "jsonl": False},
        "checkpoint": {"enabled": False},
        "model": model,
        "optim": optim,
        # TRM's data-dependent sizes (the trainer reads them from data/ when no data set is loaded)
        "data": {k: cfg.model[k] for k in ("seq_len", "vocab_size", "num_puzzle_identifiers")}
        if cfg.family == "trm"
        else {},
    }


def resolve(cfg: BenchConfig, *, seed: int = 0, jax_overrides: dict | None = None) -> dict:
    """-> plain dict both sides build from: family, model, optim, batch_size, dtype, the full
    trainer config (`trainer_cfg`, for train.step.make_task) and where it came from (`source`).

    `jax_overrides` are model fields changed on the JAX side only (e.g. scan/remat variants).
    """
    import os

    from omegaconf import OmegaConf

    trainer_cfg = None
    if cfg.experiment and os.path.exists(_experiment_path(cfg.experiment)):
        from train.compose import load_config

        overrides = [f"+experiment={cfg.experiment}", *_BENCH_TRAINER_OVERRIDES, *cfg.overrides]
        overrides.append(f"run.seed={seed}")
        if cfg.family == "gpt":
            overrides.append("trainer.gradient_accumulation_steps=1")  # as nanoGPT bench.py
        composed = load_config(overrides)
        trainer_cfg = OmegaConf.to_container(composed, resolve=True)
        source = f"configs/experiment/{cfg.experiment}.yaml + {' '.join(overrides[1:])}"
    else:
        from train.config import Config

        merged = OmegaConf.merge(OmegaConf.structured(Config), _fallback_trainer_cfg(cfg, seed))
        trainer_cfg = OmegaConf.to_container(merged, resolve=True)
        source = "bench/configs.py" + (
            f" (configs/experiment/{cfg.experiment}.yaml not found)" if cfg.experiment else ""
        )
    model = dict(trainer_cfg["model"])
    batch = int(trainer_cfg["trainer"]["global_batch_size"])
    if cfg.family == "gpt":
        dtype = model.get("dtype", "float32")
        # dtype -> autocast on the torch side; attention_impl is JAX-only (torch picks its SDPA
        # kernel itself)
        torch_model = {k: v for k, v in model.items() if k not in ("dtype", "attention_impl")}
        items = batch * int(model["block_size"])
    else:
        # data-dependent TRM fields default to the Sudoku values when the yaml leaves them out
        for k in ("seq_len", "vocab_size", "num_puzzle_identifiers"):
            model.setdefault(k, cfg.model[k])
        dtype = model.get("forward_dtype", "bfloat16")
        torch_model = dict(model)
        items = batch
    jax_model = {**model, **(jax_overrides or {})}
    trainer_cfg["model"] = jax_model
    optim = dict(trainer_cfg.get("optim") or {})
    if cfg.family == "trm":
        # the trainer's schedule length: trainer.total_steps, else upstream's
        # int(epochs * total_groups * mean_puzzle_examples / global_batch) with the data
        # section's defaults (train/trm_task.py, no data on disk)
        t, d = trainer_cfg["trainer"], trainer_cfg.get("data") or {}
        derived = int(
            int(t.get("epochs") or 0)
            * int(d.get("total_groups", 1000))
            * float(d.get("mean_puzzle_examples", 1.0))
            / batch
        )
        optim["total_steps"] = (
            int(t.get("total_steps") or 0) or derived or int(cfg.optim.get("total_steps", 100000))
        )
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
