"""Time to quality: wall time until a run reaches a target, JAX step vs the PyTorch reference.

    python -m bench ttq [--configs gpt_shakespeare_char_tiny,trm_sudoku_tiny]
                        [--impls jax,torch_eager] [--target X] [--metric M] [--max-steps N]
                        [--eval-interval K] [--data-dir DIR] [--out DIR]

Both implementations train on the SAME batches (one numpy generator per worker, same seed) with
the same schedule (the experiment's lr schedule and optimiser), and are evaluated on the same
fixed evaluation data every K steps. They run interleaved in chunks (K steps + one eval of A,
then of B, ...), so machine drift hits both alike; each side's clock counts only its own work
(first call, i.e. compile, included: that is part of the time a user waits). A side stops at the
first eval that reaches the target, or at --max-steps.

Metrics: GPT `val_loss` (mean loss over eval_iters fixed val batches, dropout off, lower is
better; nanoGPT's estimate_loss). TRM `exact_accuracy` or `accuracy` (EMA weights, a fresh carry,
halt_max_steps ACT steps in eval mode, as upstream's evaluate; higher is better) on the first
--eval-examples test puzzles.

Data: GPT reads <data-dir>/train.bin, val.bin (built by data.shakespeare_char from --input when
missing); TRM reads the upstream puzzle layout (built with the experiment's data.build_args when
missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from bench import configs as bench_configs
from bench.machine import detect_device, loadavg, result_header
from bench.report import format_ttq_table
from bench.worker import Worker, WorkerError, record_error

JSON_NAME = "ttq.json"


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


def _trm_eval_metrics(sums: dict) -> dict:
    count = max(float(sums["count"]), 1.0)
    return {
        "accuracy": float(sums["accuracy"]) / count,
        "exact_accuracy": float(sums["exact_accuracy"]) / count,
    }


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
        import jax
        import jax.numpy as jnp

        task, state = self.inner.task, self.inner.state
        gpt = self.rc["family"] == "gpt"
        if self._eval_fn is None:
            # the trainer's own evaluation of one batch: GPT's loss with dropout off; TRM's
            # upstream evaluate (EMA weights, fresh carry, halt_max_steps ACT steps)
            self._eval_fn = jax.jit(task._eval_loss if gpt else task._eval_batch)
        t0 = time.perf_counter()
        if gpt:
            losses = [
                self._eval_fn(state, jnp.asarray(b["x"], jnp.int32), jnp.asarray(b["y"], jnp.int32))
                for b in self.data.eval_batches
            ]
            out = {"val_loss": float(np.mean(jax.device_get(losses)))}
        else:
            sums = None
            for b in self.data.eval_batches:
                m = jax.device_get(self._eval_fn(state["train"], task.to_global(b))[0])
                sums = m if sums is None else {k: sums[k] + m[k] for k in sums}
            out = _trm_eval_metrics(sums)
        out["eval_s"] = time.perf_counter() - t0
        return out

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
        return {"val_loss": float(np.mean(losses)), "eval_s": time.perf_counter() - t0}


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
        out = _trm_eval_metrics(sums)
        out["eval_s"] = time.perf_counter() - t0
        return out


# ----------------------------------------------------------------------------------------------
# Driver


def prepare_data(rc: dict, data_dir: str | None, input_path: str | None) -> str:
    """The data directory for a resolved config, built if missing (as the trainer would)."""
    d = rc["trainer_cfg"].get("data") or {}
    path = data_dir or d.get("path") or f"data_out/{rc['config']}"
    if rc["family"] == "gpt":
        if not os.path.exists(os.path.join(path, "train.bin")):
            from data.shakespeare_char import build

            build(path, input_path=input_path or d.get("input") or None)
        return path
    if not os.path.exists(os.path.join(path, "train", "dataset.json")):
        import importlib

        builder, args = d.get("build"), list(d.get("build_args") or [])
        if not builder:
            raise SystemExit(
                f"bench ttq: {path} has no puzzle data and the config names no builder"
            )
        module = builder if "." in builder else f"data.{builder}"  # as train/trm_task.py
        importlib.import_module(module).main(args + ["--output-dir", path])
    return path


def _better(metric: str, value: float, target: float) -> bool:
    return value <= target if metric.endswith("loss") else value >= target


def ttq_config(cfg, impls, *, data_dir, input_path, target, metric, max_steps, eval_interval,
               eval_iters, eval_examples, seed, threads, timeout_s, log=print) -> dict:  # fmt: skip
    rc = bench_configs.resolve(cfg, seed=seed)
    t = dict(rc["ttq"])
    metric = metric or t.get("metric", "val_loss" if rc["family"] == "gpt" else "exact_accuracy")
    target = target if target is not None else t.get("target")
    max_steps = max_steps or t.get("max_steps", 1000)
    eval_interval = eval_interval or t.get("eval_interval", 100)
    path = prepare_data(rc, data_dir, input_path)
    record = {
        "config": cfg.name,
        "config_source": rc["source"],
        "metric": metric,
        "target": target,
        "max_steps": max_steps,
        "eval_interval": eval_interval,
        "data_dir": path,
        "impls": {},
    }
    workers = {}
    for impl in impls:
        spec = {
            "impl": impl, "device": detect_device(),
            "resolved": rc, "seed": seed, "threads": threads, "mode": "ttq",
            "data_dir": path, "eval_iters": eval_iters or t.get("eval_iters", 20),
            "eval_examples": eval_examples,
        }  # fmt: skip
        res = {"status": "ok", "curve": [], "busy_s": 0.0, "steps": 0, "reached": False}
        record["impls"][impl] = res
        try:
            workers[impl] = Worker(spec, timeout_s)
            res["info"] = workers[impl].info
        except WorkerError as e:
            record_error(res, e)
    active = dict(workers)
    while active:
        for name in list(active):
            w, res = active[name], record["impls"][name]
            try:
                n = min(eval_interval, max_steps - res["steps"])
                out = w.call("run", n)
                ev = w.call("eval")
            except WorkerError as e:
                record_error(res, e)
                active.pop(name).close()
                continue
            res["steps"] += n
            res["busy_s"] += out["seconds"] + ev["eval_s"]
            point = {"step": res["steps"], "wall_s": res["busy_s"], "train_loss": out["loss"], **ev}
            res["curve"].append(point)
            log(f"[{cfg.name}] {name} step {res['steps']}: {metric}={ev[metric]:.4f} "
                f"(wall {res['busy_s']:.1f} s)")  # fmt: skip
            if target is not None and _better(metric, ev[metric], target):
                res.update(
                    reached=True, steps_to_target=res["steps"], wall_to_target_s=res["busy_s"]
                )
                active.pop(name)
            elif res["steps"] >= max_steps:
                active.pop(name)
    for name, w in workers.items():
        try:
            record["impls"][name]["memory"] = w.call("stats")
        except WorkerError:
            pass
        w.close()
    a, b = record["impls"].get("jax", {}), record["impls"].get("torch_eager", {})
    if a.get("reached") and b.get("reached"):
        record["ratio_wall_jax/torch_eager"] = a["wall_to_target_s"] / b["wall_to_target_s"]
    return record


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench ttq", description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="gpt_shakespeare_char_tiny,trm_sudoku_tiny")
    p.add_argument("--impls", default="jax,torch_eager")
    # --metric/--target/--data-dir apply when ONE config is given; else each config's defaults
    p.add_argument("--metric", default=None, help="val_loss | exact_accuracy | accuracy")
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--eval-interval", type=int, default=None)
    p.add_argument("--eval-iters", type=int, default=None, help="GPT: val batches per eval")
    p.add_argument("--eval-examples", type=int, default=256, help="TRM: test puzzles per eval")
    p.add_argument("--data-dir", default=None, help="default: the experiment's data.path")
    p.add_argument("--input", default=None, help="GPT: local input.txt for the char data set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", default="bench_out")
    args = p.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python -m bench ttq " + " ".join(shlex.quote(a) for a in argv)
    result = {**result_header("ttq", command, detect_device()), "results": []}
    for name in args.configs.split(","):
        cfg = bench_configs.get(name.strip())
        multi = len(args.configs.split(",")) > 1
        result["results"].append(
            ttq_config(
                cfg,
                [i.strip() for i in args.impls.split(",")],
                data_dir=None if multi else args.data_dir,
                input_path=args.input,
                target=None if multi else args.target,
                metric=None if multi else args.metric,
                max_steps=args.max_steps,
                eval_interval=args.eval_interval,
                eval_iters=args.eval_iters,
                eval_examples=args.eval_examples,
                seed=args.seed,
                threads=args.threads,
                timeout_s=args.timeout,
            )  # fmt: skip
        )
    result["loadavg_end"] = loadavg()
    (out_dir / JSON_NAME).write_text(json.dumps(result, indent=1, default=str))
    print(format_ttq_table(result))
    print(f"wrote {out_dir / JSON_NAME}")
    return result
