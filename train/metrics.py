"""Metric sinks (JSONL always, wandb on process 0, a console line / tqdm bar) and the one-step-late
reader that keeps the host from waiting on the device.

`MetricLogger.push(step, device_metrics, host_metrics)` stores the jax arrays of step N and only
converts the PREVIOUS push to floats, i.e. after step N has been dispatched; by then step N-1 has
finished, so `device_get` returns at once and the device queue never drains (MaxText's
`buffer_and_write_metrics`, queue length 1).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import jax
import numpy as np


def _to_float(v):
    v = np.asarray(v)
    return float(v) if v.size == 1 else v.tolist()


class MetricLogger:
    def __init__(self, run_dir: str, cfg, run_id: str, config_dict: dict, total_steps: int):
        self.is_main = jax.process_index() == 0
        self.pending = None
        self.wandb_run = None
        self.jsonl = None
        self.bar = None
        self.last_console = 0.0
        if not self.is_main:
            return
        os.makedirs(run_dir, exist_ok=True)
        if cfg.logging.jsonl:
            self.jsonl = open(os.path.join(run_dir, "metrics.jsonl"), "a")  # noqa: SIM115
        mode = cfg.logging.wandb
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        if os.environ.get("WANDB_MODE") == "disabled":
            mode = "disabled"
        if mode != "disabled":
            import wandb

            # A fixed id + resume="allow": a resumed run appends to the same wandb run.
            self.wandb_run = wandb.init(
                project=cfg.logging.project,
                name=run_id,
                id=run_id.replace("/", "-"),
                resume="allow",
                dir=run_dir,
                mode=mode,
                config=config_dict,
            )
        if cfg.trainer.progress_bar and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, dynamic_ncols=True, leave=True)

    def push(self, step: int, device_metrics, host_metrics: dict | None = None):
        """Queue step's metrics; write the previous queued ones (now certainly computed)."""
        previous, self.pending = self.pending, (step, device_metrics, host_metrics or {})
        if previous is not None:
            self._write(*previous)

    def flush(self):
        if self.pending is not None:
            self._write(*self.pending)
            self.pending = None

    def write_now(self, step: int, metrics: dict):
        """Immediately write host-side metrics (eval results: already on the host)."""
        self.flush()
        self._write(step, {}, metrics)

    def _write(self, step, device_metrics, host_metrics):
        if not self.is_main:
            return
        record = {k: _to_float(v) for k, v in jax.device_get(device_metrics).items()}
        record.update(
            {k: _to_float(v) if not isinstance(v, str) else v for k, v in host_metrics.items()}
        )
        record = {"step": int(step), **record}
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if k != "step"}, step=int(step))
        self._console(record)

    def _console(self, record):
        keys = [
            k
            for k in (
                "train/loss",
                "train/lm_loss",
                "eval/val_loss",
                "eval/all/exact_accuracy",
                "train/exact_accuracy",
                "step_time_ms",
                "mfu",
            )
            if k in record
        ]
        parts = []
        for k in keys:
            v = record[k]
            parts.append(
                f"{k} {v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k} {v}"
            )
        text = f"step {record['step']}: " + ", ".join(parts)
        if self.bar is not None:
            self.bar.n = record["step"]
            self.bar.set_postfix_str(", ".join(parts), refresh=True)
            if any(k.startswith("eval/") for k in record):
                self.bar.write(text)
        elif keys:
            print(text, flush=True)

    def close(self):
        self.flush()
        if self.bar is not None:
            self.bar.close()
        if self.jsonl is not None:
            self.jsonl.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def read_jsonl(path: str) -> list[dict]:
    """All records of a metrics.jsonl (tests and tools)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class StepTimer:
    """Wall time per step measured between consecutive pushes (includes dispatch + wait)."""

    def __init__(self):
        self.t = None

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = (None if self.t is None else now - self.t), now
        return dt
