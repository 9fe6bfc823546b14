"""Inputs the trainer must not ignore or accept wrongly, and what a first run shows.

Every user-input error is one line naming the field, the value and what was expected: wrongly
typed or out-of-range values of every section (the families' model / data / optim included),
misspelt keys (with a close match), a batch that the devices or the data set cannot hold. A resume
that ignores trainer.init_from or data.input says so; a finished run started again keeps its
final.json. The command line's errors are one line (HYDRA_FULL_ERROR=1 gives the traceback) and
a CPU run is not preceded by libtpu's probe errors. wandb without a reachable server logs offline
within seconds.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import jax
import pytest
from omegaconf import OmegaConf

from tests.helpers import (
    REPO,
    build_tiny_sudoku,
    build_tiny_text,
    losses,
    tiny_gpt_overrides,
    tiny_trm_overrides,
)
from train.checkpoint import Checkpointer
from train.compose import load_config
from train.errors import ConfigError
from train.families import make_task
from train.mesh import make_mesh
from train.metrics import MetricLogger
from train.trainer import resume_settings, train


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_tiny_text(str(tmp_path_factory.mktemp("synthetic_char")))


@pytest.fixture(scope="module")
def sudoku_dir(tmp_path_factory):
    return build_tiny_sudoku(str(tmp_path_factory.mktemp("sudoku")))


def _config_error(overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# (override, what the one line must say)
_TRM_BAD = [
    ("optim.lr=fast", "optim.lr='fast': expected float"),
    ("model.hidden_size=big", "model.hidden_size='big': expected int"),
    ("model.mlp_t=3", "model.mlp_t=3: expected bool"),
    ("data.eval_interval_epochs=x", "data.eval_interval_epochs='x': expected int"),
    ("trainer.global_batch_size=abc", "trainer.global_batch_size: Value 'abc'"),
    ("run.seed=1.5", "run.seed: Value '1.5' of type 'float' could not be converted to Integer"),
    ("optim.lr=-1", "optim.lr must be > 0, got -1"),
    ("optim.weight_decay=-0.1", "optim.weight_decay must be >= 0"),
    ("optim.beta2=1.5", "optim.beta2 must be in [0, 1)"),
    ("optim.lr_warmup_steps=-5", "optim.lr_warmup_steps must be >= 0"),
    ("optim.ema_rate=2", "optim.ema_rate must be in [0, 1]"),
    ("model.hidden_size=0", "model.hidden_size must be > 0"),
    ("data.eval_batch_size=-1", "data.eval_batch_size must be >= 0"),
    ("trainer.global_batch_size=-4", "trainer.global_batch_size must be > 0"),
    ("+data.pth=x", "data: unknown key(s) ['pth'] ('pth' -> did you mean 'path'?)"),
    ("+model.hiden_size=8", "'hiden_size' -> did you mean 'hidden_size'?"),
    ("+optim.lr_warmup=3", "did you mean 'lr_warmup_steps'?"),
    ("trainer.eval_intervl=1", "'eval_intervl' -> did you mean 'eval_interval'?"),
    ("data.evaluator=arcc", "data.evaluator='arcc': expected '' or 'arc'"),
    ("+optim.loss_dtype=float32", "optim.loss_dtype: the loss's settings are model.loss_type and"),
    ("+optim.total_steps=9", "optim: unknown key(s) ['total_steps']"),
]
_GPT_BAD = [
    ("optim.learning_rate=fast", "optim.learning_rate='fast': expected float"),
    ("model.n_embd=big", "model.n_embd='big': expected int"),
    ("optim.learning_rate=0", "optim.learning_rate must be > 0"),
    ("model.dropout=1.0", "model.dropout must be in [0, 1)"),
    ("optim.grad_clip=-1", "optim.grad_clip must be >= 0"),
    ("+data.inptu=x", "data: unknown key(s) ['inptu'] ('inptu' -> did you mean 'input'?)"),
    ("data.sample_tokens=many", "data.sample_tokens='many': expected int"),
]


@pytest.mark.parametrize("override, expected", _TRM_BAD, ids=[o for o, _ in _TRM_BAD])
def test_trm_bad_value_is_one_line_naming_field_value_and_type(override, expected):
    assert expected in _config_error(["+experiment=trm_sudoku_tiny", override])


@pytest.mark.parametrize("override, expected", _GPT_BAD, ids=[o for o, _ in _GPT_BAD])
def test_gpt_bad_value_is_one_line_naming_field_value_and_type(override, expected):
    assert expected in _config_error(["+experiment=gpt_shakespeare_char_tiny", override])


def _fails_before_step_1(overrides, out) -> str:
    cfg = load_config(overrides)
    with pytest.raises(ConfigError) as e:
        train(cfg, make_mesh(cfg.mesh))  # all 8 fake CPU devices (tests/conftest.py)
    assert not os.path.exists(os.path.join(out, "r", "metrics.jsonl"))  # no step ran
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_batch_not_divisible_by_the_devices_is_one_line(sudoku_dir, tmp_path):
    assert len(jax.devices()) == 8, "needs the 8 fake CPU devices of tests/conftest.py"
    out = str(tmp_path)
    overrides = tiny_trm_overrides(sudoku_dir, out, "r") + ["trainer.global_batch_size=12"]
    msg = _fails_before_step_1(overrides, out)
    assert "trainer.global_batch_size=12 is not divisible by the 8 devices" in msg, msg
    # the TRM evaluation batch too (checked with the data, before step 1, not at the first eval)
    overrides = tiny_trm_overrides(sudoku_dir, out, "r") + ["data.eval_batch_size=20"]
    msg = _fails_before_step_1(overrides, out)
    assert msg.startswith("data.eval_batch_size=20 is not divisible by the 8 devices"), msg


@pytest.mark.parametrize(
    "batch, expected",
    [
        (1024, "trainer.global_batch_size=1024 is larger than the data set: data.epochs=2 x"),
        (64, "trainer.global_batch_size=64 is larger than one iteration of the data set: "),
    ],
)
def test_batch_larger_than_the_data_set_says_so(sudoku_dir, tmp_path, batch, expected):
    """40 train groups of one example: an epoch draws 40 examples, 2 epochs 80. A batch of 1024
    gives upstream's schedule 0 steps; one of 64 fits the run but not an iteration (1 epoch
    here, data.eval_interval_epochs=1), so no batch would ever be drawn."""
    out = str(tmp_path)
    overrides = tiny_trm_overrides(sudoku_dir, out, "r") + [f"trainer.global_batch_size={batch}"]
    msg = _fails_before_step_1(overrides, out)
    assert msg.startswith(expected), msg
    assert "40 examples per epoch (40 groups x 1)" in msg, msg


def test_finished_checkpoint_rerun_keeps_final_json_and_names_ignored_init_from(
    text_dir, tmp_path, caplog
):
    """The run directory holds the last step's checkpoint (written here with the trainer's own
    Checkpointer and meta, from the initial state: no step is compiled) and a final.json. Started
    again with trainer.init_from and data.input set, train() restores, says init_from was not
    imported (naming the step), that data.input was not read and that the run is already
    finished, returns at once and leaves final.json as it was. A missing init_from file is still
    an error on resume."""
    out = str(tmp_path / "runs")
    overrides = tiny_gpt_overrides(text_dir, out, "r", steps=4)
    input_txt = os.path.join(text_dir, "input.txt")
    cfg = load_config(overrides + [f"trainer.init_from={input_txt}", f"data.input={input_txt}"])
    mesh = make_mesh(cfg.mesh, devices=jax.devices()[:1])
    run_dir = os.path.join(out, "r")
    task = make_task(cfg, mesh)
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"), cfg.checkpoint)
    meta = {"step": 4, "best": 2.5, "best_step": 4, "resume": resume_settings(cfg, task)}
    ckpt.save(4, task.create_state(), task.train_iterator(), meta=meta, force=True)
    ckpt.close()
    final = '{"step": 4, "eval/val_loss": 2.5}\n'
    with open(os.path.join(run_dir, "final.json"), "w") as f:
        f.write(final)
    caplog.set_level(logging.INFO)
    result = train(cfg, mesh)
    text = caplog.text
    assert result == {"step": 4, "eval/val_loss": 2.5}
    assert open(os.path.join(run_dir, "final.json")).read() == final
    assert f"trainer.init_from={input_txt} was NOT imported: resuming {run_dir}" in text, text
    assert "from its own checkpoint at step 4" in text
    assert (
        f"data.path={text_dir}: no built_by.json says how it was built: read as it is, not "
        f"checked against data.build=shakespeare_char from data.input={input_txt}" in text
    ), text
    assert f"{run_dir} already finished at step 4 (final.json kept)" in text, text
    assert not os.path.exists(os.path.join(run_dir, "metrics.jsonl"))  # no step, no logger
    # A missing init_from is an error even though the run would resume and not import it.
    cfg = load_config(overrides + [f"trainer.init_from={tmp_path}/nope.pt"])
    with pytest.raises(ConfigError, match=r"trainer.init_from=.*nope.pt.*no such file"):
        train(cfg, mesh)


def test_init_from_a_torch_file_without_torch_is_one_line(text_dir, tmp_path, monkeypatch):
    """The demo's environment has no torch: a trainer.init_from .pt file is one line naming the
    key and the extra to install, before anything trains (torch emulated absent)."""
    weights = tmp_path / "ckpt.pt"
    weights.write_bytes(b"not read")
    cfg = load_config(
        tiny_gpt_overrides(text_dir, str(tmp_path), "r", steps=4) + [f"trainer.init_from={weights}"]
    )
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(ConfigError) as e:
        train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    assert str(e.value) == (
        f"trainer.init_from={str(weights)!r}: cannot import it: reading the torch file {weights} "
        "needs torch: pip install -e '.[parity]' (or convert it to .safetensors)"
    )
    assert not list((tmp_path / "r").glob("checkpoints/[0-9]*"))  # no step was saved


@pytest.mark.slow
def test_finished_run_rerun_keeps_final_json_and_says_what_it_ignored(text_dir, tmp_path, caplog):
    """An init_from that is no checkpoint is one line. One tiny GPT run to its end (run directory
    and summary lines printed), then the same run again with trainer.init_from and data.input
    set: it says it resumed instead of importing, that data.input was not read, that the run is
    already finished, and final.json is unchanged. A missing init_from file is still an error on
    resume."""
    out = str(tmp_path / "runs")
    overrides = tiny_gpt_overrides(text_dir, out, "r", steps=4)
    # Without a checkpoint init_from is imported: a file that is no checkpoint is one line
    # naming it (not torch's unpickling traceback).
    input_txt = os.path.join(text_dir, "input.txt")
    cfg = load_config(overrides + [f"trainer.init_from={input_txt}"])
    with pytest.raises(ConfigError, match=r"trainer.init_from=.*input.txt': cannot import it: "):
        train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    caplog.set_level(logging.INFO)
    cfg = load_config(overrides)
    first = train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    run_dir = os.path.join(out, "r")
    final_path = os.path.join(run_dir, "final.json")
    final = open(final_path).read()
    assert first["step"] == 4 and json.loads(final)["step"] == 4
    text = caplog.text
    assert f"run directory {run_dir}: config.yaml, metrics.jsonl, final.json" in text, text
    assert f"checkpoints in {run_dir}/checkpoints" in text
    best = json.loads(final)["eval/val_loss"]
    assert (
        f"done: 4 steps, best eval/val_loss={best:.6g} at step 4; checkpoints: "
        f"{run_dir}/checkpoints; summary: {final_path}" in text
    ), text

    caplog.clear()
    again = overrides + [f"trainer.init_from={input_txt}", f"data.input={input_txt}"]
    cfg = load_config(again)
    result = train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    text = caplog.text
    assert result["step"] == 4
    assert open(final_path).read() == final  # not overwritten with {"step": 4}
    assert f"trainer.init_from={input_txt} was NOT imported: resuming {run_dir}" in text, text
    assert "at step 4" in text
    assert (
        f"data.path={text_dir}: no built_by.json says how it was built: read as it is, not "
        f"checked against data.build=shakespeare_char from data.input={input_txt}" in text
    ), text
    assert f"{run_dir} already finished at step 4 (final.json kept)" in text, text

    missing = overrides + [f"trainer.init_from={tmp_path}/nope.pt"]
    cfg = load_config(missing)
    with pytest.raises(ConfigError, match=r"trainer.init_from=.*nope.pt.*no such file"):
        train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))


def _main(*args: str, env_extra=None, drop=("JAX_PLATFORMS",), timeout: float = 120):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "train.main", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


# libtpu's probe lines on a machine without a TPU (docs/training.md, "Setting JAX_PLATFORMS in os.environ after import jax does nothing")
_TPU_NOISE = ("libtpu", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "InitGoogle", "E0000")


_CLI_BASE = [
    "+experiment=trm_sudoku_tiny",
    "run.compilation_cache_dir=null",
    "logging.wandb=disabled",
]


def _one_error_line(done, expected: str) -> None:
    """Exit 1; `error: ...` is the only line that is not a log line (those start with the
    date); no traceback; none of libtpu's probe errors (JAX_PLATFORMS was unset)."""
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if not ln[:4].isdigit()]
    assert lines == [lines[0]] and lines[0].startswith(expected), done.stderr[-3000:]
    assert not any(noise in done.stderr for noise in _TPU_NOISE), done.stderr[-3000:]


def test_cli_mesh_error_is_one_line_without_tpu_noise(tmp_path):
    """A mesh error comes after JAX started its backend: one line, and no libtpu probe lines
    although JAX_PLATFORMS is unset (train.main sets it to cpu on a machine without a TPU)."""
    done = _main(*_CLI_BASE, f"run.out_dir={tmp_path}", "mesh.data=3")
    _one_error_line(done, "error: mesh (data, fsdp, tensor) = (3, -1, 1): 8 visible devices")


@pytest.mark.slow
def test_cli_missing_data_is_one_line_and_full_error_gives_the_traceback(tmp_path):
    done = _main(
        *_CLI_BASE, f"run.out_dir={tmp_path}", f"data.path={tmp_path}/none", "data.build=null"
    )
    _one_error_line(done, f"error: data.path='{tmp_path}/none' has no train/dataset.json")
    done = _main(
        *_CLI_BASE, f"run.out_dir={tmp_path}", "mesh.data=3", env_extra={"HYDRA_FULL_ERROR": "1"}
    )
    assert done.returncode == 1 and "Traceback" in done.stderr, done.stderr[-3000:]
    assert "ConfigError: mesh (data, fsdp, tensor) = (3, -1, 1)" in done.stderr


class _SilentServer:
    """A local TCP server that accepts connections and never answers (a stalled network)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("server", ["refused", pytest.param("silent", marks=pytest.mark.slow)])
def test_wandb_without_a_server_falls_back_to_offline_within_seconds(
    server, tmp_path, monkeypatch, caplog
):
    """With an API key (logging.wandb=auto -> online) and no reachable server the logger goes
    offline after our own short bounds, not wandb's 90 s: a refused connection is caught by the
    probe; a server that accepts and never answers by the init timeout (WANDB_INIT_TIMEOUT=4
    here; 20 s by default)."""
    silent = _SilentServer() if server == "silent" else None
    url = silent.url if silent else _closed_port_url()
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "4")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = OmegaConf.create(
        {"logging": {"wandb": "auto", "project": "p", "jsonl": True}, "trainer": {}}
    )
    cfg.trainer.progress_bar = False
    t0 = time.perf_counter()
    try:
        logger = MetricLogger(str(tmp_path), cfg, "r", {"a": 1}, 10)
        seconds = time.perf_counter() - t0
        assert logger.wandb_run is not None and logger.wandb_run.settings.mode == "offline"
        logger.write_now(1, {"eval/x": 1.0})
        logger.close()
    finally:
        if silent:
            silent.close()
    # Which bound decided, not how fast this machine is: the probe (WANDB_PROBE_TIMEOUT, 3 s)
    # names the refused URL; the silent server hits WANDB_INIT_TIMEOUT (4 s here). Either way the
    # logger never waits out wandb's own 90 s, which the 60 s bound would show on any machine.
    assert seconds < 60, seconds
    assert f"wandb: cannot reach the server ({url}" in caplog.text or server == "silent"
    assert "logging offline in" in caplog.text, caplog.text
    assert os.path.isdir(os.path.join(tmp_path, "wandb"))  # the offline run, for `wandb sync`


def test_offline_wandb_is_one_line_of_ours_unless_asked(tmp_path, monkeypatch, capfd, caplog):
    """logging.wandb=offline prints none of wandb's own lines (banner, sync hints, run summary),
    only ours saying where the run is; WANDB_SILENT=false brings wandb's back."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    caplog.set_level(logging.INFO, logger="train.metrics")
    cfg = OmegaConf.create({"logging": {"wandb": "offline", "project": "p", "jsonl": False}})
    cfg.trainer = {"progress_bar": False}
    import wandb

    printed = {}
    for silent in (None, "false"):
        wandb.teardown()  # wandb keeps the first settings of a process: start each case afresh
        if silent is None:
            monkeypatch.delenv("WANDB_SILENT", raising=False)
        else:
            monkeypatch.setenv("WANDB_SILENT", silent)
        logger = MetricLogger(str(tmp_path / str(silent)), cfg, "r", {"a": 1}, 10)
        logger.write_now(1, {"eval/x": 1.0})
        logger.close()
        out, err = capfd.readouterr()
        printed[silent] = [line for line in (out + err).splitlines() if "wandb" in line]
    assert printed[None] == [], printed[None]
    assert len(printed["false"]) > 3, printed["false"]  # wandb's own lines
    ours = [r.getMessage() for r in caplog.records if r.getMessage().startswith("wandb: offline")]
    assert ours == [f"wandb: offline, in {tmp_path / 'None'}/wandb (upload with `wandb sync`)"]


@pytest.mark.slow
def test_trm_run_ended_by_its_data_rerun_keeps_final_json(sudoku_dir, tmp_path, caplog):
    """TRM's data ends before upstream's step count (each iteration drops its partial batch: 40
    groups, batch 16, 2 iterations = 4 steps of 5 scheduled): the checkpoint is at step 4 < 5,
    so only the loop finds that no batch is left. The rerun says it is finished and keeps
    final.json."""
    out = str(tmp_path / "runs")
    overrides = tiny_trm_overrides(sudoku_dir, out, "r") + ["model.loss_dtype=float32"]
    cfg = load_config(overrides)
    mesh = make_mesh(cfg.mesh, devices=jax.devices()[:1])
    first = train(cfg, mesh)
    final_path = os.path.join(out, "r", "final.json")
    final = open(final_path).read()
    assert first["step"] == 4 and "eval/all/exact_accuracy" in json.loads(final)
    caplog.set_level(logging.INFO)
    again = train(load_config(overrides), mesh)
    assert again["step"] == 4 and open(final_path).read() == final
    assert "already finished at step 4 (final.json kept)" in caplog.text, caplog.text
    assert "run directory" in caplog.text  # the loop ran (4 < 5): not the early return


def test_text_data_offline_is_one_line_naming_the_trainers_key(tmp_path, monkeypatch):
    """A GPT run whose data set is not built and whose download fails (offline): one ConfigError
    naming the trainer's key `data.input=`, not the builder's command-line flag `--input`."""
    import urllib.error
    import urllib.request

    from train.families.gpt.data import prepare_data

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    path = str(tmp_path / "shakespeare_char")
    with pytest.raises(ConfigError, match=r"data\.input=path/to/input\.txt") as e:
        prepare_data({"path": path, "build": "shakespeare_char", "input": ""})
    assert "--input" not in str(e.value) and "\n" not in str(e.value)


_SUDOKU_EASY = ["train=10", "test=10", "blanks=30", "num_aug=0"]


@pytest.mark.parametrize(
    "build, build_args, expected",
    [
        ("sudoku_easy", ["train=abc", *_SUDOKU_EASY[1:]], "'train=abc': train must be a whole"),
        ("sudoku_easy", [*_SUDOKU_EASY, "blank=3"], "'blank=3': expected key=value, key one of"),
        ("sudoku_easy", _SUDOKU_EASY[:2], "missing blanks, num_aug"),
        ("sudoku_easy", ["train=0", "test=2", "blanks=70", "num_aug=0"], "use blanks <= 53"),
        ("sudoku_eazy", _SUDOKU_EASY, "data.build='sudoku_eazy': no module data.sudoku_eazy"),
    ],
)
def test_a_failed_data_build_is_one_line_naming_the_keys(tmp_path, build, build_args, expected):
    """data.build with a bad data.build_args value or an unknown builder: one ConfigError line
    naming data.build and the value, not the builder's traceback."""
    from train.families.trm.data import prepare_data

    d = {"path": str(tmp_path / "sudoku"), "build": build, "build_args": build_args}
    with pytest.raises(ConfigError) as e:
        prepare_data(d)
    msg = str(e.value)
    assert "\n" not in msg and expected in msg, msg
    assert msg.startswith("data.build="), msg


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_data_path_that_is_not_a_data_set_is_refused_and_kept(tmp_path, what):
    """data.path naming a file, or a folder of other things, with data.build set: one ConfigError
    line naming data.path, before any build, and what is there stays (the builder replaces only
    an empty folder or a data set)."""
    from train.families.trm.data import prepare_data

    path = tmp_path / "mine"
    mine = path / "notes.txt" if what == "folder" else path
    mine.parent.mkdir(exist_ok=True)
    mine.write_text("mine")
    d = {"path": str(path), "build": "sudoku_easy", "build_args": _SUDOKU_EASY}
    with pytest.raises(ConfigError, match=f"^data.path='{path}' \\(data.build=sudoku_easy ") as e:
        prepare_data(d)
    assert "\n" not in str(e.value) and "not replaced" in str(e.value)
    assert mine.read_text() == "mine" and sorted(os.listdir(tmp_path)) == ["mine"]


def test_text_data_from_a_missing_input_is_one_line_naming_the_trainers_key(tmp_path):
    from train.families.gpt.data import prepare_data

    path, missing = str(tmp_path / "shakespeare_char"), str(tmp_path / "input.txt")
    with pytest.raises(ConfigError, match=f"data.input='{missing}' failed: .*No such file") as e:
        prepare_data({"path": path, "build": "shakespeare_char", "input": missing})
    assert "\n" not in str(e.value)


def test_a_best_metric_no_evaluation_logs_is_said_once(sudoku_dir, tmp_path, caplog):
    """checkpoint.best_metric misspelt: one warning at the first evaluation naming it and the
    metrics there are (the run goes on: nothing is lost but the best checkpoint)."""
    overrides = tiny_trm_overrides(sudoku_dir, str(tmp_path), "r")
    cfg = load_config([*overrides, "checkpoint.best_metric=eval/all/exact_acuracy"])
    caplog.set_level(logging.WARNING)
    train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    said = [r.message for r in caplog.records if "checkpoint.best_metric" in r.message]
    assert len(said) == 1, said  # two evaluations (data.eval_interval_epochs=1, 2 epochs)
    assert said[0].startswith("checkpoint.best_metric='eval/all/exact_acuracy' is not one of")
    assert "eval/all/exact_accuracy," in said[0] and "no checkpoint is kept as the best" in said[0]
    assert len(losses(os.path.join(tmp_path, "r"), "eval/all/exact_accuracy")) == 2


def test_resume_settings_are_what_shapes_the_saved_state():
    """A checkpoint records the settings its state depends on (train.trainer.resume_settings): a
    changed one is refused by name on resume. Implementation choices that compute the same
    function (attention, cross-entropy, SwiGLU's matmuls, remat, scan) are not among them;
    optim.adamw_flat, which lays Adam's moments out as one vector, is."""
    mesh = make_mesh(load_config(["+experiment=gpt_shakespeare_char_tiny"]).mesh)
    gpt = load_config(["+experiment=gpt_shakespeare_char_tiny"])
    settings = resume_settings(gpt, make_task(gpt, mesh, need_data=False))
    assert "optim.adamw_flat" in settings and "model.n_embd" in settings
    assert not {"model.attention_impl", "model.cross_entropy_impl"} & set(settings)
    trm = load_config(["+experiment=trm_sudoku_tiny"])
    settings = resume_settings(trm, make_task(trm, mesh, need_data=False))
    assert "model.hidden_size" in settings
    free = {"model.split_gate_up", "model.scan", "model.remat", "model.embed_grad"}
    assert not free & set(settings)
