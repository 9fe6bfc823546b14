"""Export a checkpoint to the PyTorch format of the original code base.

    python -m train.export runs/gpt_shakespeare_char --out ckpt.pt      # nanoGPT ckpt.pt
    python -m train.export runs/pretrain_mlp_t_sudoku --out step_65100  # upstream TRM state_dict

GPT: nanoGPT's ckpt.pt dict (model, model_args, iter_num, best_val_loss, config), readable by its
sample.py / train.py init_from='resume' (optimizer state is not converted: `optimizer` is None).
TRM: the state_dict upstream saves (the EMA model when ema=True, as upstream's checkpoints).
SOURCE is anything train.source.open_source opens (a run directory, local or gs://, usually).
A model upstream does not have (a variant without an upstream twin: docs/architecture.md) holds
keys the original model lacks: the file is then refused, or with --allow-extra-keys written
with a line naming them (the original code base cannot load it; this one can).
Importing goes the other way with `trainer.init_from=PATH` (nanoGPT ckpt.pt, HF GPT-2 file,
upstream TRM checkpoint), through parity.gpt_params.from_torch / parity.trm_params.from_torch.
"""

from __future__ import annotations

import argparse
import sys

from train import gcs
from train.errors import (
    ConfigError,
    OneLineParser,
    exit_with,
    first_few,
    one_line,
    output_file,
)
from train.runtime import quiet_tpu_probe
from train.source import SourceError, open_source, source_family
from train.task import Task, no_torch_checkpoint


def export(
    source: str, out: str, step: int | None = None, *, allow_extra_keys: bool = False
) -> str:
    """Writes the checkpoint in the original code base's format (Task.torch_checkpoint); one
    holding keys the original model lacks (Task.keys_upstream_lacks) only with
    `allow_extra_keys`, and then with a line on stderr naming them."""
    try:
        import torch  # lazy: only this command needs torch (the trainer never imports it)
    except ImportError as e:
        _refuse_a_family_without_export(source)  # installing torch would not help it
        raise ConfigError(
            "train.export writes a PyTorch checkpoint and needs torch, which this environment "
            "lacks: pip install -e '.[parity]' (or pip install torch)"
        ) from e
    output_file(out, "--out")  # before the checkpoint is read
    src = open_source(source, step=step)
    # a run's checkpoint meta has step and best; a nanoGPT ckpt.pt has iter_num and best_val_loss
    meta = {"step": src.step or 0, "best": src.meta.get("best_val_loss"), **src.meta}
    checkpoint = src.task.torch_checkpoint(src.state, meta)
    extra = src.task.keys_upstream_lacks(checkpoint)
    if extra and not allow_extra_keys:
        raise ConfigError(
            f"{source}: its state_dict holds keys upstream's model lacks ({first_few(extra)}), "
            "a variant without an upstream twin; --allow-extra-keys writes them anyway"
        )
    if extra:
        print(f"{out}: written with keys upstream's model lacks: {first_few(extra)}",
              file=sys.stderr)  # fmt: skip
    try:
        torch.save(checkpoint, out)
    except (OSError, RuntimeError) as e:  # torch's writer: "open file failed", a full disk
        raise ConfigError(f"--out {out}: cannot be written ({one_line(e, 200)})") from e
    return out


def _refuse_a_family_without_export(source: str) -> None:
    """Task.torch_checkpoint's line for a SOURCE whose family writes no original checkpoint;
    nothing for any other (with torch installed that family's hook says it after loading)."""
    try:
        name, fam = source_family(source)  # reads config.yaml alone
    except SourceError:
        return
    if fam.task.torch_checkpoint is Task.torch_checkpoint:
        raise no_torch_checkpoint(name)


def main(argv=None):
    gcs.configure()  # STORAGE_EMULATOR_HOST set: every gs:// client goes to that server
    p = OneLineParser(
        prog="python -m train.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE", help="a run directory (or any checkpoint)")
    p.add_argument("--out", required=True)
    p.add_argument("--step", type=int, default=None, help="default: the latest checkpoint")
    p.add_argument(
        "--allow-extra-keys",
        action="store_true",
        help="write keys the original model lacks (a variant without an upstream twin); the "
        "original code base cannot load such a file",
    )
    args = p.parse_args(argv)
    quiet_tpu_probe()
    try:
        print(export(args.source, args.out, args.step, allow_extra_keys=args.allow_extra_keys))
    except ConfigError as e:
        exit_with(e)


if __name__ == "__main__":
    main()
