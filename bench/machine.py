"""What machine a benchmark ran on: CPU, GPUs, cores, load, package versions, git commit.

Standard library only: the PyTorch worker reads `cpu_count` and must not load jax.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shutil
import subprocess


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


def gpu_names() -> list[str]:
    """NVIDIA GPUs nvidia-smi lists (none without nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def detect_device() -> str:
    return "gpu" if gpu_names() else "cpu"


def loadavg() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(device: str) -> dict:
    return {
        "device": device,
        "cpu": cpu_model(),
        "cpu_cores": cpu_count(),
        "gpus": gpu_names(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "torch", "numpy")},
        "git_commit": _git_commit(),
    }


def result_header(kind: str, command: str, device: str) -> dict:
    """The opening fields of a result JSON: what ran, when, where, and the load before it."""
    return {
        "kind": kind,
        "command": command,
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": loadavg(),
        "machine": machine_info(device),
    }
