"""Small helpers shared by tests/test_train_*.py (tiny configs, reading a run's loss curve)."""

from __future__ import annotations

import os

from train.metrics import read_jsonl


def tiny_gpt_overrides(data_dir: str, out_dir: str, name: str, steps: int = 8) -> list[str]:
    """gpt_shakespeare_char_tiny shrunk to seconds: 2 layers x 32, block 32, batch 8."""
    return [
        "+experiment=gpt_shakespeare_char_tiny",
        f"run.name={name}",
        f"run.out_dir={out_dir}",
        f"data.path={data_dir}",
        "data.sample_tokens=0",
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=32",
        "model.dropout=0.1",  # exercises the dropout RNG stream (checkpointed, sharded)
        "trainer.global_batch_size=8",
        f"optim.max_iters={steps - 1}",
        f"optim.lr_decay_iters={steps - 1}",
        "optim.warmup_iters=2",
        "trainer.eval_interval=0",
        "trainer.eval_iters=2",
        "trainer.log_interval=1",
        "trainer.progress_bar=false",
        "logging.wandb=disabled",
    ]


def losses(run_dir: str, key: str = "train/loss") -> dict[int, float]:
    """step -> value from <run_dir>/metrics.jsonl; a step logged twice (killed, then resumed)
    keeps its LAST record, i.e. the value of the run that carried on."""
    out = {}
    for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        if key in r:
            out[r["step"]] = r[key]
    return out


def build_tiny_text(dest: str, input_path: str) -> str:
    """data.shakespeare_char from a local input.txt (no download)."""
    if not os.path.exists(os.path.join(dest, "train.bin")):
        from data.shakespeare_char import build

        build(dest, input_path=input_path)
    return dest


def tiny_trm_overrides(data_dir: str, out_dir: str, name: str, epochs: int = 2) -> list[str]:
    """trm_sudoku_tiny shrunk to seconds: batch 16, 2 upstream iterations of 1 epoch each."""
    return [
        "+experiment=trm_sudoku_tiny",
        f"run.name={name}",
        f"run.out_dir={out_dir}",
        f"data.path={data_dir}",
        "model.hidden_size=16",
        "model.puzzle_emb_ndim=16",
        "trainer.global_batch_size=16",
        f"trainer.epochs={epochs}",
        "data.eval_interval_epochs=1",
        "trainer.log_interval=1",
        "trainer.progress_bar=false",
        "optim.lr_warmup_steps=2",
        "logging.wandb=disabled",
    ]


def build_tiny_sudoku(dest: str) -> str:
    """40 easy train grids (x2 augmentations) + 16 test grids, offline, in a few seconds."""
    if not os.path.exists(os.path.join(dest, "train", "dataset.json")):
        from train.tiny_data import build_easy_sudoku

        build_easy_sudoku(dest, train=40, test=16, blanks=8, num_aug=1, seed=0)
    return dest
