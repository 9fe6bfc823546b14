"""The model/batch/optimiser settings each benchmark runs, JAX and PyTorch alike.

Each entry names the experiment config it mirrors (configs/experiment/<name>.yaml when the
trainer has it) and carries everything both sides need to build the same step: the model config
(nanoGPT / upstream TRM field names, so it feeds `GPTConfig`/`TRMConfig` and the PyTorch
references unchanged), the batch, the dtype policy and the optimiser hyper-parameters.

`*_tiny` configs are sized for a 2-core CPU; the others are the real sizes (GPU).
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
        optim={**_GPT_CHAR_OPTIM, "lr_decay_iters": 2000, "max_iters": 2000},
        ttq=dict(metric="val_loss", target=2.2, eval_interval=100, eval_iters=20, max_steps=2000),
    )
)
# Sudoku TRM shrunk for a CPU: same recursion shape (mlp_t, no positions, 2 layers) with narrower
# width, fewer cycles and a small batch.
_add(
    BenchConfig(
        name="trm_sudoku_tiny",
        family="trm",
        device="cpu",
        model={
            **_TRM_SUDOKU_MODEL,
            "hidden_size": 64,
            "puzzle_emb_ndim": 64,
            "num_heads": 2,
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
            "lr_warmup_steps": 20,
            "weight_decay": 0.1,
            "puzzle_emb_weight_decay": 0.1,
            "total_steps": 100000,
        },
        ttq=dict(metric="accuracy", target=0.5, eval_interval=50, max_steps=3000),
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
    )
)

CPU_DEFAULT = ("trm_sudoku_tiny", "gpt_shakespeare_char_tiny")
GPU_DEFAULT = ("trm_sudoku", "trm_sudoku_att", "gpt_shakespeare_char", "gpt2_124m")


def get(name: str) -> BenchConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"bench: unknown config {name!r}; known: {sorted(CONFIGS)}") from None
