"""launch.tpu: the gcloud commands of every step, read back from `--dry-run` output.

Each test parses what a user would paste (`shlex.split` of the printed line) and, for the ssh steps,
the remote bash script inside `--command=`, so the tests check what the worker's shell will see
(quoting of Hydra overrides included), not just the Python lists.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from launch import tpu


def dry_run(capsys, *argv: str) -> list[list[str]]:
    """The commands `--dry-run` prints, checked to read back through the shell's quoting."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    assert tpu.main([*argv[:cut], "--dry-run", *argv[cut:]]) == 0
    printed = capsys.readouterr().out
    commands = tpu.build_commands(tpu._parser().parse_args(argv))
    assert printed == "".join(shlex.join(c) + "\n" for c in commands)
    # Pasting the output into a shell gives back exactly these argv words (scripts included).
    assert shlex.split(printed) == [word for c in commands for word in c]
    return commands


def flag(cmd: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in cmd if a.startswith(name + "=")]
    assert len(values) == 1, (name, cmd)
    return values[0]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for key in (
        "TPU_PROJECT",
        "CLOUDSDK_CORE_PROJECT",
        "GOOGLE_CLOUD_PROJECT",
        "TPU_ZONE",
        "CLOUDSDK_COMPUTE_ZONE",
        "TPU_NAME",
        "TPU_ACCELERATOR_TYPE",
        "TPU_RUNTIME_VERSION",
    ):
        monkeypatch.delenv(key, raising=False)


def test_accelerator_v4_64_is_32_chips_on_8_hosts():
    acc = tpu.parse_accelerator("v4-64")
    assert (acc.chips, acc.hosts, acc.default_runtime) == (32, 8, "tpu-ubuntu2204-base")
    assert tpu.parse_accelerator("v4-8").hosts == 1
    assert tpu.parse_accelerator("v5litepod-16").hosts == 4
    assert tpu.parse_accelerator("v6e-8").hosts == 1


@pytest.mark.parametrize("bad", ["v4_64", "v4-63", "v4-4", "v3-8", "tpu-v4-64", "", "v4-64x"])
def test_bad_accelerator_names_fail_clearly(bad):
    with pytest.raises(tpu.LaunchError, match="--accelerator-type"):
        tpu.parse_accelerator(bad)


def test_create_queued_resource_on_demand_and_spot(capsys):
    (cmd,) = dry_run(capsys, "create", "--project", "my-proj")
    assert cmd[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "trm-v4-64-qr"]
    assert flag(cmd, "--node-id") == "trm-v4-64"
    assert flag(cmd, "--accelerator-type") == "v4-64"
    assert flag(cmd, "--runtime-version") == "tpu-ubuntu2204-base"
    assert flag(cmd, "--zone") == "us-central2-b"
    assert flag(cmd, "--project") == "my-proj"
    assert "--spot" not in cmd
    (cmd,) = dry_run(capsys, "create", "--project", "my-proj", "--spot", "--valid-until", "6h")
    assert "--spot" in cmd and flag(cmd, "--valid-until-duration") == "6h"


def test_settings_come_from_environment(capsys, monkeypatch):
    monkeypatch.setenv("TPU_PROJECT", "env-proj")
    monkeypatch.setenv("TPU_ZONE", "europe-west4-a")
    monkeypatch.setenv("TPU_NAME", "other")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-32")
    (cmd,) = dry_run(capsys, "create")
    assert flag(cmd, "--project") == "env-proj"
    assert flag(cmd, "--zone") == "europe-west4-a"
    assert flag(cmd, "--node-id") == "other"
    assert flag(cmd, "--accelerator-type") == "v4-32"
    # a flag wins over the environment
    (cmd,) = dry_run(capsys, "create", "--zone", "us-central2-b")
    assert flag(cmd, "--zone") == "us-central2-b"


def test_missing_project_is_a_clear_error(capsys):
    assert tpu.main(["create", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--project" in err and "TPU_PROJECT" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--zone", "uscentral"], "--zone"),
        (["--name", "Bad_Name"], "--name"),
        (["--accelerator-type", "v4-65"], "--accelerator-type"),
        (["--spot", "--reserved"], "exclusive"),
    ],
)
def test_bad_settings_fail_with_the_flag_named(capsys, argv, needle):
    assert tpu.main(["create", "--project", "p", *argv, "--dry-run"]) == 2
    assert needle in capsys.readouterr().err


def test_setup_copies_the_commit_and_installs_pinned_jax_on_all_workers(capsys):
    archive, scp, ssh = dry_run(capsys, "setup", "--project", "p", "--commit", "abc123")
    assert archive[:2] == ["git", "archive"] and archive[-1] == "abc123"
    assert scp[3:5] == ["tpu-vm", "scp"] and flag(scp, "--worker") == "all"
    assert scp[6] == "trm-v4-64:~/trm-jax-abc123.tar.gz"
    assert ssh[3:6] == ["tpu-vm", "ssh", "trm-v4-64"] and flag(ssh, "--worker") == "all"
    script = flag(ssh, "--command")
    assert "set -euo pipefail" in script
    assert "tar -xzf ~/trm-jax-abc123.tar.gz" in script
    assert "'jax[tpu]==0.10.2'" in script  # quoted: [] is a glob for the remote shell
    # idempotent: the venv is created only when missing
    assert "[ -x ~/trm-venv/bin/python ] || uv venv" in script


def test_setup_from_a_git_url(capsys):
    (ssh,) = dry_run(
        capsys, "setup", "--project", "p", "--commit", "v1.0", "--repo-url", "https://x/y.git"
    )
    script = flag(ssh, "--command")
    assert "[ -d ~/trm-jax/.git ] || git clone --quiet https://x/y.git ~/trm-jax" in script
    assert "checkout --quiet --detach v1.0" in script


def test_setup_rejects_a_commit_that_is_not_a_ref(capsys):
    assert tpu.main(["setup", "--project", "p", "--commit", "x; rm -rf /", "--dry-run"]) == 2
    assert "--commit" in capsys.readouterr().err


def test_run_starts_train_main_on_all_workers_with_quoted_overrides(capsys):
    overrides = ["+experiment=trm_sudoku", "data.path=[a,b]", "logging.project=it's mine"]
    (ssh,) = dry_run(
        capsys,
        "run",
        "--project",
        "p",
        "--run-name",
        "sudoku-1",
        "--out-dir",
        "gs://bkt/runs",
        "--env",
        "WANDB_API_KEY=k",
        "--",
        *overrides,
    )
    assert flag(ssh, "--worker") == "all"
    script = flag(ssh, "--command")
    (train_line,) = [line for line in script.splitlines() if "train.main" in line]
    # What the remote bash will pass to python: exactly our overrides + run name + out dir.
    argv = shlex.split(train_line.split("nohup ", 1)[1].split(" >>", 1)[0])
    assert argv == [
        "~/trm-venv/bin/python",
        "-m",
        "train.main",
        *overrides,
        "run.name=sudoku-1",
        "run.out_dir=gs://bkt/runs",
    ]
    assert "'data.path=[a,b]'" in train_line  # a bare [a,b] would be globbed by bash
    assert '>> "$LOG" 2>&1 < /dev/null &' in train_line
    assert "LOG=~/trm-logs/sudoku-1/worker-" in script
    assert "export WANDB_API_KEY=k" in script
    # 8 hosts: the trainer must join the others through jax.distributed.initialize()
    assert "export TRAIN_DISTRIBUTED=1" in script.splitlines()
    assert "still running" in script  # refuses to start a second copy


def test_run_on_multi_host_requires_a_gcs_out_dir(capsys):
    assert tpu.main(["run", "--project", "p", "--run-name", "r", "--dry-run"]) == 2
    assert "--out-dir is required" in capsys.readouterr().err
    argv = ["run", "--project", "p", "--run-name", "r", "--out-dir", "/tmp/runs", "--dry-run"]
    assert tpu.main(argv) == 2
    assert "gs://" in capsys.readouterr().err
    # single-host slice: a local dir is fine, and no distributed client is started
    assert tpu.main([*argv, "--accelerator-type", "v4-8"]) == 0
    assert "TRAIN_DISTRIBUTED" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--run-name", "a b"], "--run-name"),
        (["--run-name", "r", "--env", "NOVALUE"], "--env"),
        (["--run-name", "r", "--", "--lr=1"], "looks like a flag"),
    ],
)
def test_run_validation(capsys, extra, needle):
    assert tpu.main(["run", "--project", "p", "--out-dir", "gs://b/r", "--dry-run", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_logs_collect_stop_delete(capsys):
    (ssh,) = dry_run(capsys, "logs", "--project", "p", "--run-name", "r", "--follow")
    assert flag(ssh, "--worker") == "0"
    assert flag(ssh, "--command") == "tail -n 50 -F ~/trm-logs/r/worker-*.log"
    assert tpu.main(["logs", "--project", "p", "--run-name", "r", "--worker", "8", "--dry-run"])
    assert "0..7" in capsys.readouterr().err

    cmds = dry_run(capsys, "collect", "--project", "p", "--run-name", "r", "--dest", "out")
    scps = [c for c in cmds if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]]
    assert [flag(c, "--worker") for c in scps] == [str(i) for i in range(8)]
    assert [c[-4] for c in scps] == [f"out/r/worker-{i}" for i in range(8)]

    (ssh,) = dry_run(capsys, "stop", "--project", "p", "--run-name", "r")
    assert flag(ssh, "--worker") == "all"
    assert "~/trm-logs/r/worker-*.pid" in flag(ssh, "--command")

    (cmd,) = dry_run(capsys, "delete", "--project", "p")
    assert cmd[3:6] == ["queued-resources", "delete", "trm-v4-64-qr"]
    assert "--force" in cmd and "--quiet" in cmd


def test_without_gcloud_the_error_says_how_to_get_it(capsys, monkeypatch):
    monkeypatch.setattr(tpu.shutil, "which", lambda name: None)
    assert tpu.main(["status", "--project", "p"]) == 2
    assert "Google Cloud CLI" in capsys.readouterr().err


def test_exec_runs_a_command_in_the_code_dir_on_all_workers(capsys):
    (ssh,) = dry_run(
        capsys, "exec", "--project", "p", "--", "python", "-m", "data.sudoku", "--out", "a b"
    )
    assert flag(ssh, "--worker") == "all"
    assert flag(ssh, "--command").splitlines()[1:] == [
        "cd ~/trm-jax",
        "source ~/trm-venv/bin/activate",
        "python -m data.sudoku --out 'a b'",
    ]
    assert tpu.main(["exec", "--project", "p", "--dry-run"]) == 2
    assert "after '--'" in capsys.readouterr().err


def test_end_to_end_shell_script_dry_run(tmp_path):
    """launch/trm_sudoku_v4_64.sh with DRY_RUN=1 prints its gcloud commands and runs none.

    PATH holds only what the script needs (no gcloud), so a slip would fail loudly, not call Cloud.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "TPU_PROJECT": "p",
        "BUCKET": "gs://b",
        "DRY_RUN": "1",
        "PYTHON": sys.executable,
    }
    proc = subprocess.run(
        [shutil.which("bash"), "launch/trm_sudoku_v4_64.sh"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    gcloud_steps = [words[i + 3 : i + 5] for i, w in enumerate(words) if w == "gcloud"]
    assert gcloud_steps == [
        ["queued-resources", "create"],
        ["tpu-vm", "scp"],
        ["tpu-vm", "ssh"],  # setup
        ["tpu-vm", "ssh"],  # data
        ["tpu-vm", "ssh"],  # run
        ["tpu-vm", "ssh"],  # logs
    ]
    assert "--spot" in words
    run_script = [w for w in words if w.startswith("--command=") and "train.main" in w]
    # the plain command: mesh=v4-64 gives the recommended settings (tests/test_tpu_defaults.py)
    assert len(run_script) == 1 and "+experiment=trm_sudoku mesh=v4-64 run.name=" in run_script[0]
    assert "run.out_dir=gs://b/runs" in run_script[0]
