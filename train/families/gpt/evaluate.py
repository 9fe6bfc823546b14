"""GPT's part of `python -m train.evaluate`: nanoGPT's estimate_loss on the train and val splits of
--data (the trainer's own evaluation loop, GPTTask.run_eval: the same batches for the same seed).
"""

from __future__ import annotations

from train.task import Evaluation


class GPTEvaluation(Evaluation):
    """nanoGPT's estimate_loss on the train and val splits of --data (train.bin, val.bin)."""

    needs_data = True

    def report(self, src, data, *, batch=None, save_dir=None, progress=False, **options) -> dict:
        src.task.check_eval_data(data)
        m = src.task.run_eval(src.state, data)
        return {"train_loss": m["eval/train_loss"], "val_loss": m["eval/val_loss"], "metrics": m}

    def table(self, report: dict) -> list[str]:
        return [f"train loss {report['train_loss']:.4f}", f"val loss   {report['val_loss']:.4f}"]
