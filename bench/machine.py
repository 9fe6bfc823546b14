"""What machine a benchmark ran on (CPU, GPUs, cores, load, package versions, git commit), and
the one way the benchmarks run a command whose output they watch (`run_streamed`).

Standard library only: the PyTorch worker reads `cpu_count` and must not load jax.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import queue
import shlex
import shutil
import signal
import subprocess
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_count() -> int:
    """The cores this process may run on (after a worker's sched_setaffinity: its own)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def gpu_names() -> list[str]:
    """NVIDIA GPUs nvidia-smi lists (none without nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    out = _run([exe, "--query-gpu=name", "--format=csv,noheader"]) if exe else None
    return [line.strip() for line in (out or "").splitlines() if line.strip()]


def detect_device() -> str:
    return "gpu" if gpu_names() else "cpu"


def loadavg() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """HEAD's short hash, `+` appended when tracked files differ from it."""
    head = _run(["git", "rev-parse", "--short", "HEAD"], REPO)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO)
    return head and head + ("+" if dirty else "")


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def result_header(kind: str, command: str, device: str) -> dict:
    """The opening fields of a result JSON: what ran, when, where, and the load before it."""
    return {
        "kind": kind,
        "command": command,
        "started_utc": utc_now(),
        "loadavg_start": loadavg(),
        "machine": {
            "device": device,
            "cpu": cpu_model(),
            "cpu_cores": cpu_count(),
            "gpus": gpu_names(),
            "python": platform.python_version(),
            "versions": {p: version(p) for p in ("jax", "jaxlib", "flax", "optax", "torch")},
            "git_commit": git_commit(),
        },
    }


def run_streamed(cmd, *, box_s: float, log, env=None, on_line=None, cwd=REPO):
    """Run `cmd` in its own process group for at most `box_s` seconds; every output line goes to
    the open file `log` as it comes and to `on_line(t, line)` (seconds since start), which returns
    True to stop the run there. -> (exit code, seconds, how it ended: "exit" | "stopped" | "box").
    Whatever way it ends, the whole group is killed: no process outlives it."""
    t0 = time.monotonic()
    log.write(f"$ {shlex.join(str(c) for c in cmd)}\n")
    log.flush()
    # its own process group, to kill it whole; not its own session, so that whatever ends this
    # command's session ends the part as well
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", bufsize=1, process_group=0)  # fmt: skip
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)],
                     daemon=True).start()  # fmt: skip
    ended = "exit"
    try:
        while True:
            left = box_s - (time.monotonic() - t0)
            try:
                line = lines.get(timeout=left) if left > 0 else None
            except queue.Empty:
                line = None
            if line is None and time.monotonic() - t0 >= box_s:
                ended = "box"
                break
            if line is None:  # the output closed: the process is ending
                try:
                    proc.wait(timeout=max(box_s - (time.monotonic() - t0), 0.01))
                except subprocess.TimeoutExpired:
                    ended = "box"
                break
            log.write(line)
            log.flush()
            if on_line is not None and on_line(time.monotonic() - t0, line.rstrip("\n")):
                ended = "stopped"
                break
    finally:  # also when this command itself is stopped (SIGTERM, Ctrl-C)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        rc = proc.wait()
    return rc, time.monotonic() - t0, ended
