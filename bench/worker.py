"""One benchmark implementation per process, driven step by step over a pipe: `worker_main` is
the process, `Worker` the parent's handle. A process each, because JAX and PyTorch each start a
thread pool sized to the machine (in one process the idle one can still spin) and their memory
could not be told apart; only one worker computes at a time. Nothing heavy is imported at module
level: the environment (JAX_PLATFORMS, XLA_FLAGS, thread counts) is set before jax/torch load.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import resource
import sys
import time
import traceback

_FAKE_DEVICES = re.compile(r"--xla_force_host_platform_device_count=\d+")


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def prepare_env(impl: str, device: str, threads: int | None = None) -> None:
    """Environment a worker needs before jax/torch are imported.

    `threads`: pin this process to the first `threads` CPUs (sched_setaffinity) so that XLA's
    and torch's thread pools, which size themselves from the schedulable CPUs, use that many.
    """
    if threads and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    # A run under pytest inherits the suite's 8 fake CPU devices: benchmarks use the real ones
    # (docs/benchmarks.md, "A benchmark under pytest inherits the suite's 8 fake CPU devices")
    os.environ["XLA_FLAGS"] = _FAKE_DEVICES.sub("", os.environ.get("XLA_FLAGS", "")).strip()
    if device == "gpu":
        # one device per side: torch runs on one GPU, so the JAX mesh must not take all of them
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    if impl.startswith("jax"):
        os.environ["JAX_PLATFORMS"] = "cuda" if device == "gpu" else "cpu"
        # Two processes share one GPU: do not let XLA grab 75% of it up front.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if impl == "torch_compile" and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # Cold compile, like the JAX side (which has no persistent cache): inductor and triton
        # otherwise reuse kernels from earlier runs in /tmp and report a warm compile time.
        import tempfile

        fresh = tempfile.mkdtemp(prefix="bench_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh
        os.environ["TRITON_CACHE_DIR"] = os.path.join(fresh, "triton")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def apply_config_xla_flags(rc: dict) -> str:
    """The resolved config's run.xla_flags into XLA_FLAGS, as `python -m train.main` does (the
    environment's own flags win a repeat), before a JAX backend starts; -> XLA_FLAGS as run."""
    from train import xla_flags

    xla_flags.apply(((rc.get("trainer_cfg") or {}).get("run") or {}).get("xla_flags"))
    return os.environ.get("XLA_FLAGS", "")


def worker_main(conn, spec: dict) -> None:
    """Entry point of a worker process. Protocol (parent -> worker): ("run", n_steps) |
    ("eval", None) | ("stats", None) | ("close", None); every answer is ("ok", payload) or
    ("error", traceback_text)."""
    try:
        prepare_env(spec["impl"], spec["device"], spec.get("threads"))
        xla = apply_config_xla_flags(spec["resolved"]) if spec["impl"] == "jax" else None
        rss_start = rss_bytes()
        from bench import runners

        t0 = time.perf_counter()
        runner = runners.make_runner(spec)
        info = runner.setup()
        info.update(setup_s=time.perf_counter() - t0, rss_start_bytes=rss_start,
                    rss_after_setup_bytes=rss_bytes())  # fmt: skip
        if xla is not None:
            info["xla_flags"] = xla
        conn.send(("ok", info))
    except BaseException:  # noqa: BLE001 - reported to the parent, which prints it in the table
        conn.send(("error", traceback.format_exc()))
        conn.close()
        return
    while True:
        cmd, arg = conn.recv()
        if cmd == "close":
            conn.send(("ok", None))
            break
        try:
            if cmd == "run":
                seconds, loss = runner.run(int(arg))
                conn.send(("ok", {"seconds": seconds, "loss": loss}))
            elif cmd == "eval":
                conn.send(("ok", runner.evaluate()))
            elif cmd == "stats":
                kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                peak = kb * (1 if sys.platform == "darwin" else 1024)
                conn.send(("ok", {**runner.stats(), "peak_rss_bytes": peak}))
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
    conn.close()


class WorkerError(RuntimeError):
    pass


class Worker:
    """Parent-side handle of one implementation's process (`worker_main`)."""

    def __init__(self, spec: dict, timeout_s: float):
        self.name, self.timeout_s = spec["impl"], timeout_s
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, spec), daemon=True)
        self.proc.start()
        child.close()
        self.info = self._answer()

    def _answer(self):
        if not self.conn.poll(self.timeout_s):
            self.kill()
            raise WorkerError(f"{self.name}: no answer within {self.timeout_s:.0f} s")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.kill()
            raise WorkerError(f"{self.name}: worker died (exit {self.proc.exitcode})") from None
        if status != "ok":
            raise WorkerError(payload)
        return payload

    def call(self, cmd: str, arg=None):
        self.conn.send((cmd, arg))
        return self._answer()

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.conn.send(("close", None))
                self.conn.poll(10)
        except OSError:
            pass
        self.proc.join(10)
        self.kill()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def short_error(text) -> str:
    """The `SomeError: message` line of a traceback (docs/benchmarks.md, "JAX appends a note
    after the exception line")."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line):
            return line[:300]
    return lines[-1][:300] if lines else "error"


def record_error(res: dict, error: Exception) -> str:
    """Mark an implementation's result record as failed; returns the short message."""
    res.update(status="error", error=short_error(error), traceback=str(error))
    return res["error"]
