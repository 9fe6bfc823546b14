"""The benchmarks: each names the trainer experiment it measures, JAX and PyTorch alike.

An entry names configs/experiment/<experiment>.yaml plus bench overrides (e.g. nanoGPT bench.py's
12-sequence micro-batch for GPT-2 124M). `resolve()` composes that experiment exactly as
`python -m train.main +experiment=...` does, so the JAX side runs the trainer's own config and the
PyTorch side reads its model, optimiser and batch from the same composed values. Model fields use
nanoGPT / upstream TRM names, so they feed `GPTConfig` / `TRMConfig` and the PyTorch references
unchanged. `*_tiny` configs are sized for a 2-core CPU; the others are the real sizes (GPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from train.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    name: str
    family: str  # "gpt" | "trm"
    experiment: str  # configs/experiment/<experiment>.yaml
    overrides: tuple[str, ...] = ()  # Hydra overrides applied on top of the experiment
    # `python -m bench ttq`'s target: metric, target, eval_interval, eval_iters, max_steps (default:
    # the experiment's schedule)
    ttq: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def unit(self) -> str:
        return "tokens" if self.family == "gpt" else "examples"


def _configs(*entries: BenchConfig) -> dict[str, BenchConfig]:
    return {c.name: c for c in entries}


CONFIGS = _configs(
    # CPU: nanoGPT README's "CPU / MacBook" shakespeare_char variant; ~2.5 after its 300 steps
    BenchConfig("gpt_shakespeare_char_tiny", "gpt", "gpt_shakespeare_char_tiny",
                ttq=dict(metric="val_loss", target=2.6, eval_interval=50, eval_iters=20,
                         max_steps=300)),
    # CPU: Sudoku TRM shrunk for a CPU (30 blanks per grid: exact accuracy ~0.9 by step 750)
    BenchConfig("trm_sudoku_tiny", "trm", "trm_sudoku_tiny",
                ttq=dict(metric="exact_accuracy", target=0.3, eval_interval=50, max_steps=800)),
    # GPU (real sizes)
    BenchConfig("gpt_shakespeare_char", "gpt", "gpt_shakespeare_char",
                ttq=dict(metric="val_loss", target=1.47, eval_interval=250, eval_iters=200,
                         max_steps=5000)),
    # nanoGPT bench.py: 12 x 1024 tokens per step, GPT-2 124M shape, vocab padded to 50304
    BenchConfig("gpt2_124m", "gpt", "gpt2_124m", overrides=("trainer.global_batch_size=12",)),
    BenchConfig("trm_sudoku", "trm", "trm_sudoku",
                ttq=dict(metric="exact_accuracy", target=0.85, eval_interval=5000)),
    BenchConfig("trm_sudoku_att", "trm", "trm_sudoku_att"),
)  # fmt: skip

CPU_DEFAULT = ("trm_sudoku_tiny", "gpt_shakespeare_char_tiny")
GPU_DEFAULT = ("trm_sudoku", "trm_sudoku_att", "gpt_shakespeare_char", "gpt2_124m")


def get(name: str) -> BenchConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ConfigError(
            f"bench: unknown config {name!r}; known: {', '.join(sorted(CONFIGS))}"
        ) from None


# What every benchmark sets on top of the experiment: one device, no I/O
_BENCH_OVERRIDES = ("mesh=cpu", "logging.wandb=disabled", "logging.jsonl=false",
                    "checkpoint.enabled=false", "trainer.progress_bar=false")  # fmt: skip
_TRM_DATA_FIELDS = ("seq_len", "vocab_size", "num_puzzle_identifiers")


def jax_override(item: str) -> str:
    """A JAX-side override as a Hydra override: `optim.NAME=V` and `model.NAME=V` as they are, a
    bare `NAME=V` is a model field (`scan=true`, `attention_impl=explicit`)."""
    key, sep, _ = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"bench: expected KEY=VALUE, got {item!r}")
    return item if key.startswith(("model.", "optim.")) else f"model.{item}"


def _compose(overrides: list[str]) -> dict:
    from omegaconf import OmegaConf

    from train.compose import load_config

    return OmegaConf.to_container(load_config(overrides), resolve=True)


def schedule_steps(trainer_cfg: dict) -> int:
    """A TRM experiment's schedule length as the trainer computes it: trainer.total_steps, else
    upstream's from the epochs (models.trm.optim.total_steps)."""
    from models.trm.optim import total_steps

    t, d = trainer_cfg["trainer"], trainer_cfg.get("data") or {}
    return int(t.get("total_steps") or 0) or total_steps(
        int(d.get("epochs") or 0), int(d.get("total_groups", 1000)),
        float(d.get("mean_puzzle_examples", 1.0)), int(t["global_batch_size"]),
    )  # fmt: skip


def experiment_steps(experiment: str) -> int:
    """The scheduled steps of configs/experiment/<experiment>.yaml (trm_sudoku: the paper's run)."""
    return schedule_steps(_compose([f"+experiment={experiment}"]))


def resolve(cfg: BenchConfig, *, seed: int = 0, jax_overrides=(), data_path=None) -> dict:
    """-> plain dict both sides build from: family, model, optim, batch_size, dtype, the full
    trainer config (`trainer_cfg`, for train.families.make_task) and where it came from (`source`).

    `jax_overrides` (KEY=VALUE, `jax_override`) change the JAX side only, validated as the trainer
    validates its command line. `data_path` replaces data.path: the data set whose train split the
    batches come from (bench.runners.make_batch)."""
    overrides = [f"+experiment={cfg.experiment}", *_BENCH_OVERRIDES, *cfg.overrides,
                 f"run.seed={seed}"]  # fmt: skip
    if cfg.family == "gpt":
        overrides.append("data.gradient_accumulation_steps=1")  # as nanoGPT bench.py
    if data_path:
        overrides.append(f"data.path={data_path}")
    base = _compose(overrides)
    jax_overrides = [jax_override(o) for o in jax_overrides]
    trainer_cfg = _compose(overrides + jax_overrides) if jax_overrides else base
    model, optim = dict(base["model"]), dict(base.get("optim") or {})
    batch = int(base["trainer"]["global_batch_size"])
    if cfg.family == "gpt":
        dtype = model.get("dtype", "float32")
        # dtype -> autocast on the torch side; the implementation choices are JAX-only
        for k in ("dtype", "attention_impl", "cross_entropy_impl"):
            model.pop(k, None)
        items = batch * int(model["block_size"])
    else:
        for k in _TRM_DATA_FIELDS:  # the data set's sizes, as the trainer takes them without data
            model.setdefault(k, int(base["data"][k]))
        dtype = model.get("forward_dtype", "bfloat16")
        items = batch
        optim["total_steps"] = schedule_steps(base)
    sizes = {k: model[k] for k in _TRM_DATA_FIELDS} if cfg.family == "trm" else {}
    jax_model = {**sizes, **trainer_cfg["model"]}
    trainer_cfg["model"] = jax_model
    source = f"configs/experiment/{cfg.experiment}.yaml + {' '.join(overrides[1:] + jax_overrides)}"
    return {"config": cfg.name, "family": cfg.family, "model": model, "jax_model": jax_model,
            "optim": optim, "batch_size": batch, "dtype": dtype, "unit": cfg.unit,
            "items_per_step": items, "trainer_cfg": trainer_cfg, "source": source,
            "ttq": dict(cfg.ttq)}  # fmt: skip
