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
from omegaconf import OmegaConf

from train import step as step_lib
from train.checkpoint import Checkpointer
from train.config import validate
from train.mesh import make_mesh
from train.trm_task import enable_x64_if_needed


def load_run_state(run_dir: str, step: int | None = None):
    """(cfg, task, state, step) restored from <run_dir>/checkpoints on this process's devices."""
    run_dir = epath.Path(run_dir)  # local or gs://
    cfg = OmegaConf.create((run_dir / "config.yaml").read_text())
    OmegaConf.set_struct(cfg, True)
    validate(cfg)
    enable_x64_if_needed(cfg)  # as the run did (TRM float64 loss)
    mesh = make_mesh(cfg.mesh)
    task = step_lib.make_task(cfg, mesh)
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{run_dir}/checkpoints holds no checkpoint")
    abstract = step_lib.with_shardings(task.abstract_state, task.state_shardings)
    state, meta = ckpt.restore(step, abstract)
    ckpt.close()
    return cfg, task, state, meta


def export(run_dir: str, out: str, step: int | None = None) -> str:
    import torch  # only this command needs torch

    cfg, task, state, meta = load_run_state(run_dir, step)
    sd = {
        k: v if torch.is_tensor(v) else torch.from_numpy(v.copy())
        for k, v in task.export_torch(state).items()
    }
    if cfg.task == "gpt":
        m = task.model_cfg
        payload = {
            "model": sd,
            "optimizer": None,
            "model_args": dict(
                n_layer=m.n_layer,
                n_head=m.n_head,
                n_embd=m.n_embd,
                block_size=m.block_size,
                bias=m.bias,
                vocab_size=m.vocab_size,
                dropout=m.dropout,
            ),
            "iter_num": int(meta["step"]),
            "best_val_loss": meta.get("best"),
            "config": OmegaConf.to_container(cfg, resolve=True),
        }
    else:
        payload = sd
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    torch.save(payload, out)
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
    print(export(args.run_dir, args.out, args.step))


if __name__ == "__main__":
    main()
