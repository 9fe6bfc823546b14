"""Run an experiment on this machine: one process, or several standing in for TPU hosts.

    python -m launch.local -- +experiment=trm_sudoku_tiny                     # whatever jax sees
    python -m launch.local --cpu-devices 8 -- +experiment=trm_sudoku_tiny     # 8 fake CPU devices
    python -m launch.local --processes 2 --cpu-devices 4 -- +experiment=trm_sudoku_tiny

With `--processes N` it starts N copies of `python -m train.main <overrides>` on 127.0.0.1, each
with JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID set (the variables the trainer
passes to `jax.distributed.initialize`) and gloo CPU collectives, so the multi-host code paths
(per-process data slices, global arrays, one shared checkpoint, process-0-only logging) run exactly
as on an 8-host TPU slice, just smaller. Output lines are prefixed with the process id; if one
process fails the others are terminated, since the survivors would wait forever in a collective.

The project's one local launcher: `run` is the CLI's, `run_processes` runs any command the same
way and returns each process's output (the multi-process tests read per-process logs from it).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from train.errors import OneLineParser
from train.preemption import EXIT_PREEMPTED


def free_port() -> int:
    """A TCP port that is free now on 127.0.0.1 (each test/run gets its own coordinator)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(
    base: dict[str, str],
    *,
    process_id: int,
    num_processes: int,
    port: int | None,
    cpu_devices: int | None,
    platform: str | None,
) -> dict[str, str]:
    """The environment of one local process (pure function, tested)."""
    env = dict(base)
    if platform:
        env["JAX_PLATFORMS"] = platform
    if cpu_devices:
        # Both spellings: JAX_NUM_CPU_DEVICES for jax >= 0.5.1, the XLA flag for anything older.
        env["JAX_NUM_CPU_DEVICES"] = str(cpu_devices)
        flag = f"--xla_force_host_platform_device_count={cpu_devices}"
        flags = [
            f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(flag.split("=")[0])
        ]
        env["XLA_FLAGS"] = " ".join([*flags, flag])
    if num_processes > 1:
        assert port is not None
        env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
        env["JAX_NUM_PROCESSES"] = str(num_processes)
        env["JAX_PROCESS_ID"] = str(process_id)
        env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
    return env


def process_envs(
    base: dict[str, str], processes: int, cpu_devices: int | None, platform: str | None
) -> list[dict[str, str]]:
    """The environments of a run's processes, in process order (several: CPU devices, one
    coordinator on a free port)."""
    if processes < 1:
        raise ValueError(f"--processes must be >= 1, got {processes}")
    if processes > 1 and platform not in (None, "cpu"):
        raise ValueError("--processes > 1 stands in for hosts with CPU devices: use --platform cpu")
    port = free_port() if processes > 1 else None
    return [
        process_env(
            base,
            process_id=pid,
            num_processes=processes,
            port=port,
            cpu_devices=cpu_devices,
            platform="cpu" if processes > 1 else platform,
        )
        for pid in range(processes)
    ]


def commands(overrides: Sequence[str], python: str = sys.executable) -> list[str]:
    for o in overrides:
        if o.startswith("-"):
            raise ValueError(
                f"Hydra override {o!r} looks like a flag: put launcher flags before '--' and "
                "Hydra overrides (key=value, +key=value) after it"
            )
    return [python, "-m", "train.main", *overrides]


def _pump(stream, prefix: str, out, kept: list[str]) -> None:
    for line in iter(stream.readline, ""):
        kept.append(line)
        if out is not None:
            out.write(prefix + line)
            out.flush()


def run_processes(
    cmd: Sequence[str],
    *,
    processes: int = 1,
    cpu_devices: int | None = None,
    platform: str | None = None,
    timeout: float | None = None,
    cwd: str | None = None,
    echo: bool = True,
) -> tuple[int, list[tuple[int, str]]]:
    """Runs `cmd` in `processes` local processes; -> (status, [(returncode, output)] in process
    order). `status` is the first non-zero exit code, 124 when the timeout passed, else 0.

    Each output is read by a thread as it comes (and, with `echo`, written to stdout with a
    `[pN] ` prefix when there are several), so a chatty process never blocks on a full pipe. When
    one process fails the others are terminated, and killed 10 s later: a survivor would wait
    forever in its next collective. Ctrl-C lets every process save the step it reached and exit
    (train/preemption.py); a second Ctrl-C kills them.
    """
    procs, outputs = [], [[] for _ in range(processes)]
    for env in process_envs(dict(os.environ), processes, cpu_devices, platform):
        procs.append(
            subprocess.Popen(
                list(cmd),
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    out = sys.stdout if echo else None
    pumps = [
        threading.Thread(
            target=_pump,
            args=(p.stdout, f"[p{i}] " if processes > 1 else "", out, outputs[i]),
        )
        for i, p in enumerate(procs)
    ]
    for t in pumps:
        t.start()
    status, start, kill_at, interrupted = 0, time.monotonic(), None, False
    remaining = list(procs)
    try:
        while remaining:
            try:
                status, kill_at = _reap(remaining, status, kill_at)
            except KeyboardInterrupt:  # Ctrl-C reached the trainers too: they save, then exit
                if interrupted:
                    raise
                interrupted = True
                print("launch.local: waiting for every process to save its step and exit "
                      "(Ctrl-C again kills them)", file=sys.stderr)  # fmt: skip
                continue
            now = time.monotonic()
            if remaining and timeout is not None and now - start > timeout:
                status = status or 124
                break
            if remaining and kill_at is not None and now > kill_at:
                break
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for t in pumps:
            t.join()
    return status, [(p.returncode, "".join(o)) for p, o in zip(procs, outputs)]


def _reap(remaining: list, status: int, kill_at):
    """Waits a moment for each process; -> (status, kill_at). A failed process has the others
    terminated (a lone survivor would hang in its next collective); a preempted one (exit
    EXIT_PREEMPTED) does not: the others stop at the same step by themselves."""
    for p in list(remaining):
        try:
            code = p.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
        remaining.remove(p)
        if code != 0 and status == 0:
            status = code
            if code != EXIT_PREEMPTED:
                for other in remaining:
                    other.terminate()
                kill_at = time.monotonic() + 10
    return status, kill_at


def run(
    overrides: Sequence[str],
    *,
    processes: int = 1,
    cpu_devices: int | None = None,
    platform: str | None = None,
    timeout: float | None = None,
) -> int:
    """`python -m train.main <overrides>` in the processes; streams their output, returns the
    first non-zero exit code (124 on timeout, else 0)."""
    status, _ = run_processes(
        commands(overrides),
        processes=processes,
        cpu_devices=cpu_devices,
        platform=platform,
        timeout=timeout,
    )
    return status


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(prog="python -m launch.local", description=__doc__.split("\n")[0])
    p.add_argument("--processes", type=int, default=1, help="local processes standing in for hosts")
    p.add_argument("--cpu-devices", type=int, help="fake CPU devices per process")
    p.add_argument("--platform", choices=["cpu", "gpu", "tpu"], help="JAX_PLATFORMS for the run")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, after '--'")
    args = p.parse_args(argv)
    try:
        cmd = commands(args.overrides)
        if args.dry_run:
            for env in process_envs({}, args.processes, args.cpu_devices, args.platform):
                print(shlex.join(["env", *(f"{k}={v}" for k, v in sorted(env.items())), *cmd]))
            return 0
        return run(
            args.overrides,
            processes=args.processes,
            cpu_devices=args.cpu_devices,
            platform=args.platform,
        )
    except ValueError as e:
        print(f"launch.local: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
