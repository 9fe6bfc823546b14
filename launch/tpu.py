"""Drive a Cloud TPU slice (default a v4-64: 8 hosts x 4 chips) with gcloud.

    python -m launch.tpu create  --project P [--spot]          # queued resource -> ACTIVE slice
    python -m launch.tpu status  --project P                   # state of the queued resource
    python -m launch.tpu setup   --project P [--commit SHA]    # code + venv on every worker
    python -m launch.tpu run     --project P --run-name R --out-dir gs://B/runs -- +experiment=trm_sudoku mesh=v4-64
    python -m launch.tpu logs    --project P --run-name R [--worker 0] [--follow]
    python -m launch.tpu collect --project P --run-name R      # copy every worker's log here
    python -m launch.tpu exec    --project P -- python -m data.sudoku ...   # any command, all workers
    python -m launch.tpu stop    --project P --run-name R      # save the step reached, exit
    python -m launch.tpu delete  --project P                   # delete the slice and its queue entry

Every step is a pure function from settings to a list of argv lists (`*_commands`); `main` either
runs them or, with `--dry-run`, prints them shell-quoted so they can be read, pasted or tested.
Settings come from flags, else from the environment (TPU_PROJECT / CLOUDSDK_CORE_PROJECT /
GOOGLE_CLOUD_PROJECT, TPU_ZONE, TPU_NAME, TPU_ACCELERATOR_TYPE, TPU_RUNTIME_VERSION), else from
the defaults below. The docs are docs/tpu_runbook.md.

A multi-host job is the same `python -m train.main ...` started on every worker at once
(`--worker=all`): each process finds its peers through `jax.distributed.initialize()` (the GCE
metadata server), so there is nothing to pass per worker. Resuming after a preemption is running
`run` again with the same run name and out dir: the trainer restores the newest checkpoint it finds there.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence

from train.config import RunConfig
from train.errors import OneLineParser

DEFAULT_ZONE = "us-central2-b"  # where public v4 capacity lives
DEFAULT_NAME = "trm-v4-64"
DEFAULT_ACCELERATOR = "v4-64"
DEFAULT_JAX_VERSION = "0.10.2"  # jax[tpu]==0.10.2 pins libtpu==0.0.42.*
DEFAULT_PYTHON = "3.12"  # the TPU image ships 3.10; uv fetches a newer one into the venv

# On every worker: code in REMOTE_DIR, the venv in REMOTE_VENV, logs in REMOTE_LOGS/<run name>/.
REMOTE_DIR = "~/trm-jax"
REMOTE_VENV = "~/trm-venv"
REMOTE_LOGS = "~/trm-logs"

# Hydra keys of the trainer's config that the launcher sets (train/config.py RunConfig): the run
# directory, which holds checkpoints and metrics, is <run.out_dir>/<run.name>.
RUN_NAME_KEY = "run.name"
OUT_DIR_KEY = "run.out_dir"

# Generation -> (cores per chip in the slice name, default runtime image). v4/v5p names count
# TensorCores (v4-64 = 32 chips); v5e/v6e names count chips.
_GENERATIONS = {
    "v4": (2, "tpu-ubuntu2204-base"),
    "v5p": (2, "v2-alpha-tpuv5"),
    "v5litepod": (1, "v2-alpha-tpuv5-lite"),
    "v6e": (1, "v2-alpha-tpuv6e"),
}
_CHIPS_PER_HOST = 4  # every multi-host slice of these generations has 4 chips per VM
_SINGLE_HOST_MAX_CHIPS = {"v4": 4, "v5p": 4, "v5litepod": 8, "v6e": 8}

_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LaunchError(ValueError):
    """A setting is missing or malformed; the message names the flag and what was expected."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """A parsed accelerator type such as `v4-64`."""

    name: str
    generation: str
    chips: int
    hosts: int
    default_runtime: str


def parse_accelerator(name: str) -> Accelerator:
    """`v4-64` -> 32 chips on 8 hosts. Raises LaunchError for names gcloud would reject."""
    m = re.fullmatch(r"(v4|v5p|v5litepod|v6e)-([0-9]+)", name or "")
    if m is None:
        raise LaunchError(
            f"--accelerator-type {name!r}: expected <generation>-<size> with generation one of "
            f"{sorted(_GENERATIONS)}, e.g. v4-64 (the number counts TensorCores on v4/v5p)"
        )
    generation, size = m.group(1), int(m.group(2))
    cores_per_chip, runtime = _GENERATIONS[generation]
    min_size = 8 if cores_per_chip == 2 else 1
    if size < min_size or size & (size - 1):
        raise LaunchError(
            f"--accelerator-type {name!r}: size must be a power of two >= {min_size} "
            f"(e.g. {generation}-8, {generation}-16, {generation}-64)"
        )
    chips = size // cores_per_chip
    hosts = 1 if chips <= _SINGLE_HOST_MAX_CHIPS[generation] else chips // _CHIPS_PER_HOST
    return Accelerator(name, generation, chips, hosts, runtime)


@dataclasses.dataclass(frozen=True)
class Target:
    """Which slice: every gcloud call needs project, zone and node name."""

    project: str
    zone: str
    name: str
    accelerator: Accelerator
    runtime_version: str

    @property
    def queued_resource(self) -> str:
        return f"{self.name}-qr"

    def location_flags(self) -> list[str]:
        return [f"--project={self.project}", f"--zone={self.zone}"]


def _first_env(*keys: str) -> str | None:
    for key in keys:
        if os.environ.get(key):
            return os.environ[key]
    return None


def resolve_target(
    project: str | None = None,
    zone: str | None = None,
    name: str | None = None,
    accelerator_type: str | None = None,
    runtime_version: str | None = None,
) -> Target:
    """Flags win over environment variables, which win over defaults; everything is validated."""
    project = project or _first_env("TPU_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT")
    if not project:
        raise LaunchError(
            "no Google Cloud project: pass --project or set TPU_PROJECT (or CLOUDSDK_CORE_PROJECT)"
        )
    zone = zone or _first_env("TPU_ZONE", "CLOUDSDK_COMPUTE_ZONE") or DEFAULT_ZONE
    if not _ZONE_RE.fullmatch(zone):
        raise LaunchError(f"--zone {zone!r}: expected a zone such as {DEFAULT_ZONE}")
    name = name or _first_env("TPU_NAME") or DEFAULT_NAME
    if not _NAME_RE.fullmatch(name):
        raise LaunchError(
            f"--name {name!r}: expected lower-case letters, digits and '-', starting with a "
            "letter, at most 63 characters (a Compute Engine resource name)"
        )
    accelerator = parse_accelerator(
        accelerator_type or _first_env("TPU_ACCELERATOR_TYPE") or DEFAULT_ACCELERATOR
    )
    runtime = runtime_version or _first_env("TPU_RUNTIME_VERSION") or accelerator.default_runtime
    return Target(project, zone, name, accelerator, runtime)


# --- the commands of each step -------------------------------------------------------------------

_TPUS = ["gcloud", "compute", "tpus"]


def _ssh(target: Target, command: str, worker: str = "all") -> list[str]:
    return [
        *_TPUS,
        "tpu-vm",
        "ssh",
        target.name,
        *target.location_flags(),
        f"--worker={worker}",
        f"--command={command}",
    ]


def create_commands(
    target: Target, *, spot: bool = False, reserved: bool = False, valid_until: str | None = None
) -> list[list[str]]:
    """Queue a request for the slice. Spot is ~60-70% cheaper but can be preempted at any time."""
    if spot and reserved:
        raise LaunchError("--spot and --reserved are exclusive: pick one provisioning model")
    cmd = [
        *_TPUS,
        "queued-resources",
        "create",
        target.queued_resource,
        f"--node-id={target.name}",
        *target.location_flags(),
        f"--accelerator-type={target.accelerator.name}",
        f"--runtime-version={target.runtime_version}",
    ]
    if spot:
        cmd.append("--spot")
    if reserved:
        cmd.append("--reserved")
    if valid_until:
        cmd.append(f"--valid-until-duration={valid_until}")
    return [cmd]


def status_commands(target: Target) -> list[list[str]]:
    return [
        [
            *_TPUS,
            "queued-resources",
            "describe",
            target.queued_resource,
            *target.location_flags(),
        ]
    ]


def delete_commands(target: Target) -> list[list[str]]:
    """--force deletes the TPU node together with its queued resource."""
    return [
        [
            *_TPUS,
            "queued-resources",
            "delete",
            target.queued_resource,
            *target.location_flags(),
            "--force",
            "--quiet",
        ]
    ]


def setup_script(
    *,
    repo_url: str | None,
    commit: str,
    archive_name: str | None,
    jax_version: str = DEFAULT_JAX_VERSION,
    python_version: str = DEFAULT_PYTHON,
) -> str:
    """Idempotent per-worker setup: running it twice leaves the worker as running it once."""
    q = shlex.quote
    lines = [
        "set -euo pipefail",
        'export PATH="$HOME/.local/bin:$PATH"',
        # uv installs a modern Python next to the image's 3.10 without touching the system one.
        "command -v uv >/dev/null || python3 -m pip install --user --quiet uv",
    ]
    if repo_url:
        lines += [
            f"[ -d {REMOTE_DIR}/.git ] || git clone --quiet {q(repo_url)} {REMOTE_DIR}",
            f"git -C {REMOTE_DIR} fetch --quiet origin",
            f"git -C {REMOTE_DIR} checkout --quiet --detach {q(commit)}",
        ]
    else:
        assert archive_name is not None
        # Unpack beside, then swap, so a half-copied tree never replaces a working one.
        lines += [
            f"rm -rf {REMOTE_DIR}.new && mkdir -p {REMOTE_DIR}.new",
            f"tar -xzf ~/{q(archive_name)} -C {REMOTE_DIR}.new",
            f"rm -rf {REMOTE_DIR} && mv {REMOTE_DIR}.new {REMOTE_DIR}",
        ]
    lines += [
        f"[ -x {REMOTE_VENV}/bin/python ] || uv venv --quiet --python {q(python_version)} {REMOTE_VENV}",
        # the gcs extra: gcsfs (the gs:// backend of etils.epath, which Orbax uses for checkpoint
        # metadata) and google-cloud-storage (the run directory's lease)
        f"uv pip install --quiet --python {REMOTE_VENV}/bin/python "
        f"{q(f'jax[tpu]=={jax_version}')} -e {q(f'{REMOTE_DIR}[gcs]')}",
        f"{REMOTE_VENV}/bin/python -c "
        + q(
            'import jax, libtpu, socket; print("jax", jax.__version__, "on", socket.gethostname())'
        ),
    ]
    return "\n".join(lines)


def setup_commands(
    target: Target,
    *,
    commit: str,
    repo_url: str | None = None,
    jax_version: str = DEFAULT_JAX_VERSION,
    python_version: str = DEFAULT_PYTHON,
) -> list[list[str]]:
    """Put the code at `commit` and a venv with pinned jax[tpu] on every worker.

    With `repo_url` the workers clone it; otherwise the local checkout's commit is packed with
    `git archive` (committed files only, so what runs is exactly that commit) and copied over.
    """
    if not re.fullmatch(r"[0-9A-Za-z._/-]+", commit):
        raise LaunchError(f"--commit {commit!r}: expected a commit hash, tag or branch name")
    commands: list[list[str]] = []
    archive_name = None
    if repo_url is None:
        archive_name = f"trm-jax-{commit.replace('/', '_')}.tar.gz"
        local_archive = os.path.join("/tmp", archive_name)
        commands.append(["git", "archive", "--format=tar.gz", f"--output={local_archive}", commit])
        commands.append(
            [
                *_TPUS,
                "tpu-vm",
                "scp",
                local_archive,
                f"{target.name}:~/{archive_name}",
                *target.location_flags(),
                "--worker=all",
            ]
        )
    script = setup_script(
        repo_url=repo_url,
        commit=commit,
        archive_name=archive_name,
        jax_version=jax_version,
        python_version=python_version,
    )
    commands.append(_ssh(target, script))
    return commands


def _log_dir(run_name: str) -> str:
    return f"{REMOTE_LOGS}/{run_name}"


def _check_run_name(run_name: str) -> None:
    if not run_name or not _RUN_NAME_RE.fullmatch(run_name):
        raise LaunchError(
            f"--run-name {run_name!r}: expected letters, digits, '.', '_' or '-' "
            "(it names the log folder and the wandb run)"
        )


def run_script(
    *,
    run_name: str,
    overrides: Sequence[str],
    env: Sequence[str] = (),
) -> str:
    """Start the trainer in the background on one worker, logging to worker-<id>.log.

    The worker id comes from the metadata server (the id jax.distributed uses), falling back to
    the hostname off Cloud. A still-running process of the same run is an error, never a second
    copy: two trainers on one host would fight over its 4 chips. A run directory another trainer
    holds (another slice, an old job) is refused with the trainer's own line (train/rundir.py).
    """
    q = shlex.quote
    log_dir = _log_dir(run_name)
    out_dir = next(
        (o.split("=", 1)[1] for o in reversed(overrides) if o.startswith(f"{OUT_DIR_KEY}=")),
        RunConfig.out_dir,
    )
    python = f"{REMOTE_VENV}/bin/python"
    metadata = (
        "http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number"
    )
    train = " ".join([python, "-m", "train.main", *map(q, overrides)])
    lines = [
        "set -euo pipefail",
        f"mkdir -p {log_dir}",
        f"WORKER=$(curl -sf -H 'Metadata-Flavor: Google' {metadata} || hostname)",
        f'LOG={log_dir}/worker-"$WORKER".log',
        f'PID_FILE={log_dir}/worker-"$WORKER".pid',
        'if [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then',
        f'  echo "run {run_name} is still running on worker $WORKER (pid $(cat "$PID_FILE")); '
        f'stop it first" >&2; exit 1',
        "fi",
        f"cd {REMOTE_DIR}",
        *(f"export {q(item)}" for item in env),
        # exit 0: free, 3: no such run directory yet (both start), 1: held (its line; stop)
        f"{python} -m train.rundir check {q(f'{out_dir}/{run_name}')} || [ $? -eq 3 ]",
        f'nohup {train} >> "$LOG" 2>&1 < /dev/null &',
        'echo $! > "$PID_FILE"',
        'echo "worker $WORKER: pid $!, log $LOG"',
    ]
    return "\n".join(lines)


def run_commands(
    target: Target,
    *,
    run_name: str,
    overrides: Sequence[str],
    out_dir: str | None = None,
    env: Sequence[str] = (),
    allow_local_run_dir: bool = False,
) -> list[list[str]]:
    """Start `python -m train.main <overrides>` on every worker at once.

    The run dir <out_dir>/<run_name> holds checkpoints; on more than one host it must be in a gs://
    bucket because every host writes its shards of ONE checkpoint and every host must read all of
    it back on resume (a per-host local dir would hold 1/8 of a checkpoint each).
    """
    _check_run_name(run_name)
    for item in env:
        key = item.split("=", 1)[0]
        if "=" not in item or not _ENV_KEY_RE.fullmatch(key):
            raise LaunchError(f"--env {item!r}: expected NAME=VALUE")
    for o in overrides:
        if o.startswith("-"):
            raise LaunchError(
                f"Hydra override {o!r} looks like a flag: put launcher flags before '--' and "
                "Hydra overrides (key=value, +key=value) after it"
            )
    if out_dir is None:
        if target.accelerator.hosts > 1 and not allow_local_run_dir:
            raise LaunchError(
                f"--out-dir is required on {target.accelerator.name} "
                f"({target.accelerator.hosts} hosts): pass a gs://bucket/path that every host "
                "can read and write, e.g. --out-dir gs://my-bucket/runs"
            )
    elif (
        target.accelerator.hosts > 1 and not out_dir.startswith("gs://") and not allow_local_run_dir
    ):
        raise LaunchError(
            f"--out-dir {out_dir!r}: {target.accelerator.name} has {target.accelerator.hosts} "
            "hosts, which must all see one checkpoint; use a gs:// path (or pass "
            "--allow-local-run-dir if the path is a shared filesystem mounted on every host)"
        )
    if target.accelerator.hosts > 1:
        # train/distributed.py calls jax.distributed.initialize() (worker list from the metadata
        # server) only when asked to; a single-host VM needs no distributed client.
        env = ["TRAIN_DISTRIBUTED=1", *env]
    full = [*overrides, f"{RUN_NAME_KEY}={run_name}"]
    if out_dir is not None:
        full.append(f"{OUT_DIR_KEY}={out_dir}")
    return [_ssh(target, run_script(run_name=run_name, overrides=full, env=env))]


def logs_commands(
    target: Target, *, run_name: str, worker: str = "0", lines: int = 50, follow: bool = False
) -> list[list[str]]:
    _check_run_name(run_name)
    _check_worker(target, worker)
    tail = f"tail -n {int(lines)}" + (" -F" if follow else "")
    return [_ssh(target, f"{tail} {_log_dir(run_name)}/worker-*.log", worker=worker)]


def collect_commands(target: Target, *, run_name: str, dest: str) -> list[list[str]]:
    """Copy each worker's log folder to dest/worker-<i>/ (one scp per worker, so none overwrite)."""
    _check_run_name(run_name)
    commands = []
    for i in range(target.accelerator.hosts):
        out = os.path.join(dest, run_name, f"worker-{i}")
        commands.append(["mkdir", "-p", out])
        commands.append(
            [
                *_TPUS,
                "tpu-vm",
                "scp",
                "--recurse",
                f"{target.name}:{_log_dir(run_name)}/*",
                out,
                *target.location_flags(),
                f"--worker={i}",
            ]
        )
    return commands


def exec_commands(target: Target, *, argv: Sequence[str], worker: str = "all") -> list[list[str]]:
    """Run one command in the code dir with the venv active, on every worker (or one)."""
    _check_worker(target, worker)
    if not argv:
        raise LaunchError("exec: give the command after '--', e.g. -- python -m data.sudoku --help")
    script = (
        f"set -euo pipefail\ncd {REMOTE_DIR}\nsource {REMOTE_VENV}/bin/activate\n{shlex.join(argv)}"
    )
    return [_ssh(target, script, worker=worker)]


STOP_WAIT_S = 600  # how long `stop` waits for a trainer to save its step and exit


def stop_script(*, run_name: str, wait_s: int = STOP_WAIT_S) -> str:
    """SIGTERM the run's trainer on one worker (only a pid this launcher recorded), then wait
    until it has saved the step it reached and exited (train/preemption.py), and say which step.

    Every worker gets the signal at once; the trainers agree on one step among themselves. A
    trainer still running after `wait_s` keeps its pid file, so `run` still refuses a second copy.
    """
    log_dir = _log_dir(run_name)
    return "\n".join(
        [
            f"for f in {log_dir}/worker-*.pid; do",
            '  [ -f "$f" ] || continue',
            '  pid=$(cat "$f"); log="${f%.pid}.log"',
            '  if ! kill -TERM "$pid" 2>/dev/null; then rm -f "$f"; continue; fi',
            '  echo "pid $pid: stopping (it saves the step it reached first)"',
            f'  for _ in $(seq {int(wait_s)}); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done',
            '  if kill -0 "$pid" 2>/dev/null; then',
            f'    echo "pid $pid still running after {int(wait_s)} s; see $log" >&2',
            "  else",
            '    echo "pid $pid saved and exited: $(grep -a "^preempted at step" "$log" | tail -n 1)"',
            '    rm -f "$f"',
            "  fi",
            "done",
        ]
    )


def stop_commands(target: Target, *, run_name: str) -> list[list[str]]:
    """Stop the run on every worker: each saves the step they agree on, then exits."""
    _check_run_name(run_name)
    return [_ssh(target, stop_script(run_name=run_name))]


def _check_worker(target: Target, worker: str) -> None:
    if worker == "all":
        return
    if not worker.isdigit() or int(worker) >= target.accelerator.hosts:
        raise LaunchError(
            f"--worker {worker!r}: expected 'all' or 0..{target.accelerator.hosts - 1} "
            f"({target.accelerator.name} has {target.accelerator.hosts} hosts)"
        )


# --- command line --------------------------------------------------------------------------------


def _git_head() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise LaunchError("--commit not given and this is not a git checkout: pass --commit")
    return out.stdout.strip()


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--project", help="Google Cloud project (env TPU_PROJECT)")
    common.add_argument("--zone", help=f"zone (env TPU_ZONE, default {DEFAULT_ZONE})")
    common.add_argument("--name", help=f"TPU node name (env TPU_NAME, default {DEFAULT_NAME})")
    common.add_argument(
        "--accelerator-type",
        help=f"e.g. v4-64 (env TPU_ACCELERATOR_TYPE, default {DEFAULT_ACCELERATOR})",
    )
    common.add_argument(
        "--runtime-version", help="TPU VM image (env TPU_RUNTIME_VERSION, default per generation)"
    )
    common.add_argument(
        "--dry-run", action="store_true", help="print the commands instead of running them"
    )

    p = OneLineParser(prog="python -m launch.tpu", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="step", required=True)

    c = sub.add_parser("create", parents=[common], help="queue a request for the slice")
    c.add_argument("--spot", action="store_true", help="spot capacity (cheaper, preemptible)")
    c.add_argument("--reserved", action="store_true", help="use a reservation of the project")
    c.add_argument("--valid-until", help="give up if not provisioned within e.g. 6h")

    sub.add_parser("status", parents=[common], help="show the queued resource and its state")
    sub.add_parser("delete", parents=[common], help="delete the slice and its queued resource")

    s = sub.add_parser("setup", parents=[common], help="code + venv on every worker (idempotent)")
    s.add_argument("--commit", help="commit to install (default: this checkout's HEAD)")
    s.add_argument("--repo-url", help="clone this URL on the workers instead of copying")
    s.add_argument("--jax-version", default=DEFAULT_JAX_VERSION)
    s.add_argument("--python-version", default=DEFAULT_PYTHON)

    r = sub.add_parser("run", parents=[common], help="start train.main on every worker")
    r.add_argument("--run-name", required=True)
    r.add_argument(
        "--out-dir", help="parent of the run dir (checkpoints); gs://... on multi-host slices"
    )
    r.add_argument("--env", action="append", default=[], help="NAME=VALUE exported before training")
    r.add_argument("--allow-local-run-dir", action="store_true")
    r.add_argument("overrides", nargs="*", help="Hydra overrides, after '--'")

    lg = sub.add_parser("logs", parents=[common], help="tail a worker's log")
    lg.add_argument("--run-name", required=True)
    lg.add_argument("--worker", default="0", help="worker index or 'all'")
    lg.add_argument("--lines", type=int, default=50)
    lg.add_argument("--follow", action="store_true")

    co = sub.add_parser("collect", parents=[common], help="copy all workers' logs here")
    co.add_argument("--run-name", required=True)
    co.add_argument("--dest", default="tpu-logs")

    ex = sub.add_parser("exec", parents=[common], help="run a command on every worker")
    ex.add_argument("--worker", default="all", help="worker index or 'all'")
    ex.add_argument("argv", nargs="*", help="the command, after '--'")

    st = sub.add_parser("stop", parents=[common], help="stop the run on every worker")
    st.add_argument("--run-name", required=True)
    return p


def build_commands(args: argparse.Namespace) -> list[list[str]]:
    target = resolve_target(
        args.project, args.zone, args.name, args.accelerator_type, args.runtime_version
    )
    if args.step == "create":
        return create_commands(
            target, spot=args.spot, reserved=args.reserved, valid_until=args.valid_until
        )
    if args.step == "status":
        return status_commands(target)
    if args.step == "delete":
        return delete_commands(target)
    if args.step == "setup":
        return setup_commands(
            target,
            commit=args.commit or _git_head(),
            repo_url=args.repo_url,
            jax_version=args.jax_version,
            python_version=args.python_version,
        )
    if args.step == "run":
        return run_commands(
            target,
            run_name=args.run_name,
            overrides=args.overrides,
            out_dir=args.out_dir,
            env=args.env,
            allow_local_run_dir=args.allow_local_run_dir,
        )
    if args.step == "logs":
        return logs_commands(
            target, run_name=args.run_name, worker=args.worker, lines=args.lines, follow=args.follow
        )
    if args.step == "collect":
        return collect_commands(target, run_name=args.run_name, dest=args.dest)
    if args.step == "exec":
        return exec_commands(target, argv=args.argv, worker=args.worker)
    if args.step == "stop":
        return stop_commands(target, run_name=args.run_name)
    raise AssertionError(args.step)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = build_commands(args)
    except LaunchError as e:
        print(f"launch.tpu {args.step}: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for cmd in commands:
            print(shlex.join(cmd))
        return 0
    if shutil.which("gcloud") is None:
        print(
            "launch.tpu: gcloud is not on PATH: install the Google Cloud CLI "
            "(https://cloud.google.com/sdk/docs/install) or use --dry-run",
            file=sys.stderr,
        )
        return 2
    for cmd in commands:
        print("+", shlex.join(cmd), file=sys.stderr, flush=True)
        result = subprocess.run(cmd, check=False)
        if result.returncode != 0:
            print(f"launch.tpu {args.step}: command failed ({result.returncode})", file=sys.stderr)
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
