"""The toy family's pieces of the commands (what train/families/<family>/evaluate.py and sample.py
hold): `python -m train.evaluate` on held-out examples of its own choosing (`--examples N`), and
`python -m train.sample`, which prints the class the model predicts for inputs of the toy stream
(`--start I`: the first batch index, an option GPT's sampler also names).
"""

from __future__ import annotations

import jax
import numpy as np

from tests.toy_family.task import local_rows, toy_batch
from train.task import Evaluation, Sampler


class ToyEvaluation(Evaluation):
    """Accuracy on `--examples` held-out examples (default: the run's data.eval_examples)."""

    def add_arguments(self, parser) -> None:
        parser.add_argument("--examples", type=int, default=None, metavar="N",
                            help="held-out examples to evaluate on")  # fmt: skip

    def report(self, src, data, *, batch=None, save_dir=None, progress=False, examples=None):
        task = src.task
        n = examples or task.data_cfg.eval_examples
        rows = local_rows(toy_batch(task.cfg.run.seed + 1, 0, n, task.model_cfg))
        sums = jax.jit(task.eval_step)(src.state, task.to_global(rows, task.batch_shapes(n)))
        metrics = task.eval_metrics(jax.device_get(sums))
        return {"examples": n, "metrics": {f"eval/{k}": v for k, v in metrics.items()}}

    def table(self, report: dict) -> list[str]:
        m = report["metrics"]
        accuracy, loss = m["eval/accuracy"], m["eval/loss"]
        return [f"examples {report['examples']}: accuracy {accuracy:.4f} loss {loss:.4f}"]


class ToySampler(Sampler):
    """The predicted class of each input of one batch of the toy stream."""

    def add_arguments(self, parser) -> None:
        parser.add_argument("--start", type=int, default=0, help="batch index in the stream")
        parser.add_argument("--num-samples", type=int, default=4)

    def sample(self, src, args) -> list[str]:
        task = src.task
        batch = toy_batch(task.cfg.run.seed, args.start, args.num_samples, task.model_cfg)
        model, _ = task.model(src.state)
        predicted = np.asarray(jax.device_get(model(batch["x"]).argmax(-1)))
        return [f"input {args.start}:{i} -> class {int(c)}" for i, c in enumerate(predicted)]
