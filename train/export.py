"""Export a run's checkpoint to the PyTorch format of the original code base.

    python -m train.export runs/gpt_shakespeare_char --out ckpt.pt      # nanoGPT ckpt.pt
    python -m train.export runs/pretrain_mlp_t_sudoku --out step_65100  # upstream TRM state_dict

GPT: nanoGPT's ckpt.pt dict (model, model_args, iter_num, best_val_loss, config), readable by its
sample.py / train.py init_from='resume' (optimizer state is not converted: `optimizer` is None).
TRM: the state_dict upstream saves (the EMA model when ema=True, as upstream's checkpoints).
Importing goes the other way with `trainer.init_from=PATH` (nanoGPT ckpt.pt, HF GPT-2 name or
file, upstream TRM checkpoint), through models.gpt.from_torch / models.trm.from_torch.
"""

from __future__ import annotations

import argparse
import os

from etils import epath

from train import families
from train import jit as jit_lib
from train.checkpoint import Checkpointer
from train.compose import load_run_config
from train.distributed import quiet_tpu_probe
from train.mesh import make_mesh


def load_run_state(run_dir: str, step: int | None = None):
    """(cfg, task, state, meta) restored from <run_dir>/checkpoints on this process's devices."""
    run_dir = epath.Path(run_dir)  # local or gs://
    cfg = load_run_config((run_dir / "config.yaml").read_text())
    families.enable_x64_if_needed(cfg)  # as the run did (TRM float64 loss)
    mesh = make_mesh(cfg.mesh)
    task = families.make_task(cfg, mesh)
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{run_dir}/checkpoints holds no checkpoint")
    abstract = jit_lib.with_shardings(task.abstract_state, task.state_shardings)
    state, meta = ckpt.restore(step, abstract)
    ckpt.close()
    return cfg, task, state, meta


def export(run_dir: str, out: str, step: int | None = None) -> str:
    """Writes the run's checkpoint in the original code base's format (Task.torch_checkpoint)."""
    import torch  # lazy: only this command needs torch (the trainer never imports it)

    _, task, state, meta = load_run_state(run_dir, step)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    torch.save(task.torch_checkpoint(state, meta), out)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m train.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--step", type=int, default=None, help="default: the latest checkpoint")
    args = p.parse_args(argv)
    quiet_tpu_probe()
    print(export(args.run_dir, args.out, args.step))


if __name__ == "__main__":
    main()
