"""Start N local JAX processes of one command (multi-host code paths on one machine; tests).

    results = run_local_processes([sys.executable, "-m", "train.main", "+experiment=..."],
                                  num_processes=2, devices_per_process=4, timeout=300)

Each process gets JAX_COORDINATOR_ADDRESS (127.0.0.1:<free port>), JAX_NUM_PROCESSES,
JAX_PROCESS_ID (read by train/distributed.py), XLA_FLAGS with its fake CPU device count and gloo
CPU collectives. If one process fails or the timeout passes, the others are killed: a survivor
would otherwise wait forever in a collective. (launch/local.py is the user-facing launcher.)
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(base, process_id, num_processes, port, devices_per_process):
    env = dict(base)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices_per_process}"
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
    if num_processes > 1:
        env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
        env["JAX_NUM_PROCESSES"] = str(num_processes)
        env["JAX_PROCESS_ID"] = str(process_id)
    return env


def run_local_processes(
    cmd, *, num_processes, devices_per_process, timeout=600, env=None, cwd=None
):
    """Runs `cmd` in `num_processes` processes; returns [(returncode, output)] in process order.

    Raises RuntimeError with every process's output tail if any fails or times out.
    """
    base = dict(os.environ if env is None else env)
    port = free_port()
    procs = []
    # Output goes to files, not pipes: nobody reads a pipe while we poll, so a process that logs more
    # than the pipe buffer (64 KiB) would block on write forever and hit the timeout.
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(num_processes)]
    for i in range(num_processes):
        procs.append(
            subprocess.Popen(
                cmd,
                env=process_env(base, i, num_processes, port, devices_per_process),
                cwd=cwd,
                stdout=logs[i],
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout
    outputs = [None] * num_processes
    failed = None
    try:
        pending = set(range(num_processes))
        while pending:
            for i in list(pending):
                if procs[i].poll() is not None:
                    pending.discard(i)
                    if procs[i].returncode != 0 and failed is None:
                        failed = i
            if failed is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for i, p in enumerate(procs):
            p.wait()
            logs[i].seek(0)
            outputs[i] = logs[i].read()
            logs[i].close()
    results = [(p.returncode, out) for p, out in zip(procs, outputs)]
    if failed is not None or any(rc != 0 for rc, _ in results):
        tails = "\n".join(
            f"--- process {i} (rc {rc}) ---\n{out[-4000:]}" for i, (rc, out) in enumerate(results)
        )
        why = "timed out" if failed is None and time.monotonic() > deadline else "failed"
        raise RuntimeError(f"local multi-process run {why}:\n{tails}")
    return results
