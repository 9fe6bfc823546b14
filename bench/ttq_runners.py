"""The time-to-quality workers' runners: the bench.runners implementations fed from one data
stream and evaluated on fixed data (driven by bench/ttq.py through bench/worker.py).

Both sides draw the same batches (one numpy generator per worker, same seed). Evaluation: GPT
`val_loss`; TRM the raw metric sums of upstream's evaluate, which the driver normalises with the
trainer's own rule (models.trm.losses.normalize_metrics) — the PyTorch worker never loads jax.
"""

from __future__ import annotations

import os
import time

import numpy as np

# ----------------------------------------------------------------------------------------------
# Data (numpy only: the same draws in every worker)


class GPTData:
    """nanoGPT get_batch: random windows of block_size+1 tokens from a uint16 token file."""

    def __init__(self, data_dir: str, block_size: int, batch_size: int, seed: int, eval_iters: int):
        self.train = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
        self.val = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
        self.T, self.B = block_size, batch_size
        self.rng = np.random.default_rng(seed)
        eval_rng = np.random.default_rng(seed + 1)
        self.eval_batches = [self._window(self.val, eval_rng) for _ in range(eval_iters)]

    def _window(self, data, rng):
        ix = rng.integers(0, len(data) - self.T - 1, size=self.B)
        x = np.stack([data[i : i + self.T] for i in ix]).astype(np.int64)
        y = np.stack([data[i + 1 : i + 1 + self.T] for i in ix]).astype(np.int64)
        return {"x": x, "y": y}

    def next(self):
        return self._window(self.train, self.rng)


class PuzzleData:
    """Random training rows (with replacement) and a fixed test slice of an upstream data set."""

    def __init__(self, data_dir: str, batch_size: int, seed: int, eval_examples: int):
        from data.puzzle_format import load_split

        self.B = batch_size
        self.rng = np.random.default_rng(seed)
        self.train = self._flatten(load_split(data_dir, "train"))
        split = (
            "test" if os.path.exists(os.path.join(data_dir, "test", "dataset.json")) else "train"
        )
        test = self._flatten(load_split(data_dir, split))
        n = min(eval_examples, len(test["inputs"]))
        n -= n % batch_size if n >= batch_size else 0
        self.eval_batches = []
        for s in range(0, max(n, 1), batch_size):
            rows = np.arange(s, s + batch_size) % len(test["inputs"])
            self.eval_batches.append({k: v[rows] for k, v in test.items()})
        self.eval_split = split

    @staticmethod
    def _flatten(ps):
        arr = ps.sets["all"]
        example_puzzle = (
            np.searchsorted(arr.puzzle_indices, np.arange(len(arr.inputs)), "right") - 1
        )
        return {
            "inputs": np.asarray(arr.inputs, np.int32),
            "labels": np.asarray(arr.labels, np.int32),
            "puzzle_identifiers": arr.puzzle_identifiers[example_puzzle].astype(np.int32),
        }

    def next(self):
        rows = self.rng.integers(0, len(self.train["inputs"]), size=self.B)
        return {k: v[rows] for k, v in self.train.items()}


def make_data(rc: dict, spec: dict):
    if rc["family"] == "gpt":
        return GPTData(spec["data_dir"], rc["model"]["block_size"], rc["batch_size"],
                       spec["seed"], spec["eval_iters"])  # fmt: skip
    return PuzzleData(spec["data_dir"], rc["batch_size"], spec["seed"], spec["eval_examples"])


# ----------------------------------------------------------------------------------------------
# Runners with data and evaluation (built on bench.runners)


def make_ttq_runner(spec: dict):
    rc = spec["resolved"]
    if spec["impl"] == "jax":
        return JaxTTQ(rc, spec)
    cls = TorchGPTTTQ if rc["family"] == "gpt" else TorchTRMTTQ
    return cls(rc, spec, compile=spec["impl"] == "torch_compile")


class JaxTTQ:
    def __init__(self, rc, spec):
        from bench.runners import JaxRunner

        self.inner = JaxRunner(rc, spec)
        self.rc, self.spec = rc, spec

    def setup(self):
        info = self.inner.setup()
        self.data = make_data(self.rc, self.spec)
        self._eval_fn = None
        return info

    def run(self, n: int):
        import jax

        from bench.runners import _loss_of, place_batch

        r = self.inner
        t0 = time.perf_counter()
        for _ in range(n):
            r.state, metrics = r.step_fn(r.state, place_batch(r.task, self.data.next()))
        jax.block_until_ready(r.state)
        return time.perf_counter() - t0, _loss_of(metrics)

    def evaluate(self, _arg=None) -> dict:
        """The trainer's own evaluation step (Task.eval_step: GPT's loss with dropout off;
        TRM's upstream evaluate, EMA weights, a fresh carry, halt_max_steps ACT steps), summed
        over the fixed eval batches; the driver turns the sums into the metric."""
        import jax

        task, state = self.inner.task, self.inner.state
        if self._eval_fn is None:
            self._eval_fn = jax.jit(task.eval_step)
        t0 = time.perf_counter()
        sums = {}
        for b in self.data.eval_batches:
            shapes = task.batch_shapes(len(next(iter(b.values()))))
            m = jax.device_get(self._eval_fn(state, task.to_global(b, shapes)))
            sums = {k: sums.get(k, 0.0) + float(v) for k, v in m.items()}
        return {"sums": sums, "eval_s": time.perf_counter() - t0}

    def stats(self):
        return self.inner.stats()


class _TorchTTQ:
    """A bench.runners torch runner fed from the time-to-quality data stream; subclasses say how
    a batch reaches the runner (`_load`), how to read the step's loss, and how to evaluate."""

    runner_name: str

    def __init__(self, rc, spec, compile):
        from bench import runners

        self.inner = getattr(runners, self.runner_name)(rc, spec, compile)
        self.rc, self.spec = rc, spec

    def setup(self):
        info = self.inner.setup()
        self.data = make_data(self.rc, self.spec)
        return info

    def run(self, n: int):
        from bench.runners import _torch_sync

        r = self.inner
        t0 = time.perf_counter()
        for _ in range(n):
            self._load(self.data.next())
            loss = r._step()
        _torch_sync(r.dev)
        return time.perf_counter() - t0, self._loss_value(loss)

    def stats(self):
        return self.inner.stats()


class TorchGPTTTQ(_TorchTTQ):
    runner_name = "TorchGPTRunner"

    def _load(self, b):
        import torch

        r = self.inner
        r.x = torch.from_numpy(b["x"]).to(r.dev)
        r.y = torch.from_numpy(b["y"]).to(r.dev)

    def _loss_value(self, loss) -> float:
        return float(loss.detach().float().cpu())

    def evaluate(self, _arg=None) -> dict:
        import torch

        r = self.inner
        t0 = time.perf_counter()
        r.model.eval()
        losses = []
        with torch.no_grad():
            for b in self.data.eval_batches:
                x, y = (torch.from_numpy(b[k]).to(r.dev) for k in ("x", "y"))
                with r.ctx():
                    losses.append(float(r.fwd(x, y)[1].float().cpu()))
        r.model.train()
        sums = {"loss": float(np.sum(losses)), "count": float(len(losses))}
        return {"sums": sums, "eval_s": time.perf_counter() - t0}


class TorchTRMTTQ(_TorchTTQ):
    runner_name = "TorchTRMRunner"

    def _load(self, b):
        import torch

        self.inner.batch = {k: torch.from_numpy(v).to(self.inner.dev) for k, v in b.items()}

    def _loss_value(self, loss) -> float:
        return float(loss.float().cpu()) / self.rc["batch_size"]

    def evaluate(self, _arg=None) -> dict:
        import torch

        r = self.inner
        t0 = time.perf_counter()
        model = r.ema.ema_copy(r.model) if r.ema is not None else r.model
        model.eval()
        sums = None
        with torch.no_grad(), torch.device(r.dev):
            for b in self.data.eval_batches:
                batch = {k: torch.from_numpy(v).to(r.dev) for k, v in b.items()}
                carry = model.initial_carry(batch)
                for _ in range(self.rc["model"]["halt_max_steps"]):
                    carry, _, metrics, _, _ = model(carry=carry, batch=batch)
                m = {k: float(v) for k, v in metrics.items()}
                sums = m if sums is None else {k: sums[k] + m[k] for k in sums}
        r.model.train()
        return {"sums": sums, "eval_s": time.perf_counter() - t0}
