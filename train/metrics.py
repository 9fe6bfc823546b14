"""Metric sinks (JSONL always, wandb on process 0, a console line / tqdm bar) and the one-step-late
reader that keeps the host from waiting on the device.

The run directory may be local or a bucket (`run.out_dir=gs://...`): every file operation goes through
`etils.epath.Path`, which Orbax uses too. Object stores cannot append, so there `metrics.jsonl` is
kept in memory and rewritten whole at every `sync()` (each eval, checkpoint and the end).

`MetricLogger.push(step, device_metrics, host_metrics)` stores the jax arrays of step N and only
converts the PREVIOUS push to floats, i.e. after step N has been dispatched; by then step N-1 has
finished, so `device_get` returns at once and the device queue never drains (MaxText's
`buffer_and_write_metrics`, queue length 1).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import sys
import urllib.parse

import jax
import numpy as np
from etils import epath

from train.errors import disk_full_names, one_line

log = logging.getLogger(__name__)


def _to_float(v):
    v = np.asarray(v)
    return float(v) if v.size == 1 else v.tolist()


def _finite_or_none(v):
    """(v with every non-finite float -> None, whether one was replaced); lists elementwise."""
    if isinstance(v, float) and not math.isfinite(v):
        return None, True
    if isinstance(v, list | tuple):
        pairs = [_finite_or_none(x) for x in v]
        return [x for x, _ in pairs], any(bad for _, bad in pairs)
    return v, False


def strict_json(record: dict, flag: str = "nonfinite") -> dict:
    """`record` as strict JSON can hold it: NaN / +-inf values become null and their keys are
    listed under `flag` (JSON has no NaN; Python's json would write a bare `NaN`)."""
    out, bad = {}, []
    for k, v in record.items():
        out[k], replaced = _finite_or_none(v)
        if replaced:
            bad.append(k)
    if bad:
        out[flag] = bad
    return out


def dumps(record: dict) -> str:
    """One strict JSON document (`allow_nan=False`: raises rather than write NaN / Infinity)."""
    return json.dumps(strict_json(record), allow_nan=False)


def is_local(path) -> bool:
    """False for a URL-style path (gs://, s3://, ...), which epath handles through its backends."""
    return "://" not in str(path)


def write_text_atomic(path, text: str) -> None:
    """Writes `path` whole or not at all (a temporary file renamed over it): a full disk or a
    kill mid-write leaves the previous file, never a truncated one. DiskFullError names `path`."""
    path = epath.Path(path)
    tmp = path.parent / f".{path.name}.tmp"
    with disk_full_names(path):
        try:
            tmp.write_text(text)
            tmp.replace(path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


class JsonlFile:
    """Append-only JSON-lines file: a real append on a local disk (flushed per line, so a killed
    run keeps what it logged), a whole-file rewrite per `sync()` on an object store. A write that
    finds the disk full raises DiskFullError naming the file."""

    def __init__(self, path, *, rewrite: bool | None = None, resumed_at: int | None = None):
        self.path = epath.Path(path)
        self.rewrite = not is_local(path) if rewrite is None else rewrite
        if self.rewrite:
            old = self.path.read_text().splitlines(keepends=True) if self.path.exists() else []
            # the steps after the checkpoint a run resumes from are trained and logged again:
            # their old records go (a local file keeps them; its later record of a step wins)
            self.lines = [line for line in old if not _after(line, resumed_at)]
            self.dirty = len(self.lines) != len(old)
        else:  # unbuffered: a line is on disk when write returns, or not at all
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict):
        line = dumps(record) + "\n"
        if self.rewrite:
            self.lines.append(line)
            self.dirty = True
        else:
            self._append(line.encode())

    def sync(self):
        if self.rewrite and self.dirty:
            with disk_full_names(self.path):
                self.path.write_text("".join(self.lines))
            self.dirty = False

    def close(self):
        try:
            self.sync()
        finally:
            if not self.rewrite and self.fd is not None:
                os.close(self.fd)
                self.fd = None

    def _append(self, data: bytes):
        """Appends whole lines: a write cut short (a full disk) is cut back off the file, so
        the file never ends in half a line."""
        size = os.fstat(self.fd).st_size
        with disk_full_names(self.path):
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, size)
                raise


def _after(line: str, step: int | None) -> bool:
    """Whether the JSONL `line` records a step after `step` (None: no step is)."""
    if step is None:
        return False
    try:
        return int(json.loads(line)["step"]) > step
    except (ValueError, KeyError, TypeError):  # a damaged line stays as it is
        return False


# Shown on the console line of every family, after the family's own (Task.console_metrics)
SPEED_METRICS = ("step_time_ms", "mfu")


class MetricLogger:
    def __init__(self, run_dir, cfg, run_id: str, config_dict: dict, total_steps: int,
                 console_metrics=(), resumed_at: int | None = None):  # fmt: skip
        self.is_main = jax.process_index() == 0
        self.console_metrics = (*console_metrics, *SPEED_METRICS)
        self.pending = None
        self.wandb_run = None
        self.jsonl = None
        self.bar = None
        self.last_console = 0.0
        if not self.is_main:
            return
        run_dir = epath.Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.logging.jsonl:
            self.jsonl = JsonlFile(run_dir / "metrics.jsonl", resumed_at=resumed_at)
        mode = cfg.logging.wandb
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        if os.environ.get("WANDB_MODE") == "disabled" or mode == "off":
            mode = "disabled"
        if mode != "disabled":
            # A fixed id + resume="allow": a resumed run appends to the same wandb run.
            self.wandb_run = init_wandb(
                mode,
                project=cfg.logging.project,
                name=run_id,
                id=run_id.replace("/", "-"),
                resume="allow",
                dir=_wandb_dir(run_dir, run_id),
                config=config_dict,
            )
        if cfg.trainer.progress_bar and sys.stderr.isatty():
            from tqdm import tqdm  # lazy: only on a terminal

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
        self.sync()

    def sync(self):
        """Make what was written so far durable (object stores: rewrite metrics.jsonl)."""
        if self.jsonl is not None:
            self.jsonl.sync()

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
            self.jsonl.write(record)
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if k != "step"}, step=int(step))
        self._console(record)

    def _console(self, record):
        keys = [k for k in self.console_metrics if k in record]
        parts, blocks = [], []
        for k in keys:
            v = record[k]
            if isinstance(v, str):  # a text (GPT's sample): its first lines, under the line
                blocks.append(text_block(k, v))
            else:
                parts.append(
                    f"{k} {v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k} {v}"
                )
        text = "\n".join([f"step {record['step']}: " + ", ".join(parts), *blocks])
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


# A text metric on the console: at most this many of its lines, each cut to this width
TEXT_LINES, TEXT_WIDTH = 6, 100


def text_block(key: str, text: str) -> str:
    """`key` and the first TEXT_LINES non-empty lines of `text`, indented, each cut to
    TEXT_WIDTH characters (the whole text is in metrics.jsonl)."""
    lines = [line[:TEXT_WIDTH] for line in text.splitlines() if line.strip()][:TEXT_LINES]
    return "\n".join([f"  {key}:", *(f"    {line}" for line in lines)])


def read_jsonl(path) -> list[dict]:
    """All records of a metrics.jsonl (tests and tools; local or gs://)."""
    return [
        json.loads(line, parse_constant=_no_constant)
        for line in epath.Path(path).read_text().splitlines()
        if line.strip()
    ]


def _no_constant(name: str):
    raise ValueError(f"not strict JSON: {name} (metrics.jsonl writes null + a nonfinite flag)")


# Seconds an online wandb.init may take before the run falls back to offline (wandb's own default
# is 90 s, and then it raises; WANDB_INIT_TIMEOUT, if set, wins): the reachability probe below
# catches a missing network sooner.
WANDB_INIT_TIMEOUT = 20.0
WANDB_PROBE_TIMEOUT = 3.0


def wandb_unreachable(timeout: float = WANDB_PROBE_TIMEOUT) -> str | None:
    """None when wandb's server (WANDB_BASE_URL, default api.wandb.ai) accepts a TCP connection
    within `timeout` seconds, else why not. Behind an HTTP(S) proxy nothing is probed (None)."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return None
    url = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout).close()
    except OSError as e:
        return f"{url}: {e or type(e).__name__}"
    return None


def init_wandb(mode: str, **kwargs):
    """wandb.init in `mode`; an online run whose server cannot be reached (probe, or an init that
    fails within WANDB_INIT_TIMEOUT s) logs offline instead, with one warning: the run goes on,
    and `wandb sync <dir>` uploads it later."""
    import wandb  # lazy: seconds to import, and only when logging is on

    if mode == "online":
        reason = wandb_unreachable()
        if reason is None:
            try:
                timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", WANDB_INIT_TIMEOUT))
                settings = wandb.Settings(init_timeout=timeout)
                return wandb.init(mode="online", settings=settings, **kwargs)
            except Exception as e:  # wandb raises its CommError, UsageError, or a timeout
                reason = one_line(e)
                wandb.teardown()  # else its service still holds the run id ("in use")
        log.warning(
            "wandb: cannot reach the server (%s); logging offline in %s (upload later with "
            "`wandb sync`)",
            reason,
            kwargs.get("dir"),
        )
        mode = "offline"
    if mode == "offline" and "WANDB_SILENT" not in os.environ:
        # wandb's own lines (its banner, sync hints, a run summary at the end) stay out of the
        # log: one line of ours says where the run is; WANDB_SILENT=false shows them
        log.info("wandb: offline, in %s/wandb (upload with `wandb sync`)", kwargs.get("dir"))
        kwargs["settings"] = wandb.Settings(silent=True)
    return wandb.init(mode=mode, **kwargs)


def _wandb_dir(run_dir, run_id: str) -> str:
    """wandb writes its files with plain os calls: the run dir when local, else a local folder."""
    if is_local(run_dir):
        return str(run_dir)
    local = os.path.join(
        os.path.expanduser("~"), ".cache", "trm-jax-wandb", run_id.replace("/", "-")
    )
    os.makedirs(local, exist_ok=True)
    return local
