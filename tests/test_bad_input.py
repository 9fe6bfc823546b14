"""Every failure a user can cause is one line, and costs nothing: ONE table of command x bad input.

Each row runs a command in this process, through its `main(argv)` as `python -m` does, on one bad
input, and checks what docs/training.md ("Bad input is one line") promises of every command:

- it exits with a non-zero status and the one line `error: ...`, naming the file or key and what
  was expected (the row's words);
- nothing printed is a traceback;
- nothing was touched: every file under the row's own folder and under the shared world (finished
  runs of both families, a live trainer's in-flight save planted in each, data sets, exported
  files) is byte for byte as before, none added or removed: a reader never writes into a run;
- a row whose input would run code when loaded (a pickle's GLOBAL, a YAML tag) finds its marker
  file absent afterwards: the code never ran.

A new command or a new bad input joins by a row. `world` builds its runs without training (the
trainer's own Checkpointer saves a fresh state), so the table stays in the default tier.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable

import jax
import pytest

from tests.helpers import (
    build_tiny_sudoku,
    build_tiny_text,
    snapshot,
    tiny_gpt_overrides,
    tiny_trm_overrides,
)
from train.rundir import LOCK_FILE

MARKER = "code-ran"  # what every payload below would create, in the row's folder


# --- the world the rows read: runs, data, files --------------------------------------------------
@dataclasses.dataclass
class World:
    root: str
    sudoku: str
    text: str
    trm_run: str
    gpt_run: str
    upstream: str | None  # an upstream TRM state_dict (train.export), None without torch
    nanogpt: str | None  # a nanoGPT ckpt.pt (train.export), None without torch

    def trm(self, *extra):
        return [*tiny_trm_overrides(self.sudoku, f"{self.root}/runs", "trm_new"), *extra]

    def gpt(self, *extra, out: str | None = None, name: str = "gpt_new"):
        return [*tiny_gpt_overrides(self.text, out or f"{self.root}/runs", name), *extra]


def _saved_run(overrides, run_dir: str, step: int) -> None:
    """A run directory as the trainer leaves it (config.yaml, one checkpoint of a fresh state),
    plus the temporary directory of a save in flight, as a live trainer has it mid-save."""
    from omegaconf import OmegaConf

    from train.checkpoint import Checkpointer
    from train.compose import load_config
    from train.families import make_task
    from train.mesh import make_mesh

    cfg = load_config(overrides)
    task = make_task(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"), cfg.checkpoint)
    ckpt.save(step, task.create_state(), task.train_iterator(), meta={"step": step}, force=True)
    ckpt.close()
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))
    inflight = os.path.join(run_dir, "checkpoints", f"{step + 1}.orbax-checkpoint-tmp-1")
    os.makedirs(os.path.join(inflight, "state"))
    with open(os.path.join(inflight, "state", "partial"), "wb") as f:
        f.write(b"a save a live trainer is writing")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = str(tmp_path_factory.mktemp("world"))
    sudoku = build_tiny_sudoku(os.path.join(root, "sudoku"))
    text = build_tiny_text(os.path.join(root, "text"))
    runs = os.path.join(root, "runs")
    _saved_run(tiny_trm_overrides(sudoku, runs, "trm"), os.path.join(runs, "trm"), 2)
    _saved_run(tiny_gpt_overrides(text, runs, "gpt"), os.path.join(runs, "gpt"), 8)
    upstream = nanogpt = None
    if _has("torch"):
        from train.export import export

        upstream = export(os.path.join(runs, "trm"), os.path.join(root, "upstream", "step_2"))
        nanogpt = export(os.path.join(runs, "gpt"), os.path.join(root, "nanogpt", "ckpt.pt"))
    return World(root, sudoku, text, os.path.join(runs, "trm"), os.path.join(runs, "gpt"),
                 upstream, nanogpt)  # fmt: skip


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# --- bad inputs, each made in the row's own folder `d` ------------------------------------------
def _payload(d) -> object:
    """An object whose unpickling runs `touch <d>/code-ran`."""

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {os.path.join(d, MARKER)}",))

    return Payload()


def _copy(src: str, dst: str) -> str:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _dataset_json(w: World, d, split: str, edit) -> str:
    """A copy of the tiny Sudoku set whose <split>/dataset.json is `edit(text)`."""
    path = _copy(w.sudoku, os.path.join(d, "sudoku"))
    meta = os.path.join(path, split, "dataset.json")
    with open(meta) as f:
        text = f.read()
    with open(meta, "w") as f:
        f.write(edit(text))
    return path


def _field(name, value):
    return lambda text: json.dumps({**json.loads(text), name: value})


def _upstream_with(w: World, d, all_config: str) -> str:
    os.makedirs(os.path.join(d, "up"))
    path = shutil.copy(w.upstream, os.path.join(d, "up", "step_2"))
    with open(os.path.join(d, "up", "all_config.yaml"), "w") as f:
        f.write(all_config)
    return path


def _run_with(run: str, d, edit) -> str:
    """A copy of a saved run, changed by `edit(run_dir)`."""
    path = _copy(run, os.path.join(d, os.path.basename(run)))
    edit(path)
    return path


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _linked_step(w: World, d) -> list[str]:
    """train.main resuming a copy of the GPT run whose newest step directory is a link."""

    def link(run):
        step = os.path.join(run, "checkpoints", "8")
        os.rename(step, os.path.join(d, "step-8"))
        os.symlink(os.path.join(d, "step-8"), step)

    _run_with(w.gpt_run, d, link)
    return w.gpt("trainer.max_steps=9", out=d, name="gpt")


def _endless(w: World, d) -> list[str]:
    def link(run):
        meta = os.path.join(run, "checkpoints", "8", "meta", "metadata")
        os.remove(meta)
        os.symlink("/dev/zero", meta)

    return [_run_with(w.gpt_run, d, link)]


def _unsafe_meta_pkl(w: World, d) -> str:
    """The GPT run, its data set's meta.json gone and its meta.pkl a payload."""
    text = _copy(w.text, os.path.join(d, "text"))
    os.remove(os.path.join(text, "meta.json"))
    with open(os.path.join(text, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": 47, "stoi": _payload(d)}, f)

    def point_at_it(run):
        cfg = os.path.join(run, "config.yaml")
        with open(cfg) as f:
            body = f.read()
        _write(cfg, body.replace(f"path: {w.text}", f"path: {text}"))

    return _run_with(w.gpt_run, d, point_at_it)


def _torch_file(d, name: str, obj) -> str:
    import torch

    path = os.path.join(d, name)
    torch.save(obj, path)
    return path


def _no_meta_ckpt(w: World, d) -> str:
    """The exported nanoGPT ckpt.pt with no data set named: its encoding is GPT-2 BPE."""
    import torch

    ckpt = torch.load(w.nanogpt, weights_only=True)
    ckpt["config"] = {}
    return _torch_file(d, "ckpt.pt", ckpt)


def _not_ours(w: World, d) -> str:
    """A Sudoku test split alone (train.evaluate --data takes it) beside a user's notes."""
    from data.sudoku_easy import build_easy_sudoku

    path = os.path.join(d, "mine")
    build_easy_sudoku(path, train=0, test=4, blanks=8, num_aug=0)
    _write(os.path.join(path, "NOTES.md"), "my notes")
    return path


# --- the table ------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    id: str
    command: str  # train.main | train.evaluate | train.sample | train.export | data.<builder>
    argv: Callable  # (world, the row's folder) -> argv
    expect: tuple  # words the one line holds
    absent: tuple = ()  # modules this environment is made to lack
    needs: tuple = ()  # modules the row's inputs need (torch: .pt files)
    marker: bool = False  # the input carries a payload


T = ("torch",)
ROWS = [
    # -- train.main: config values --
    Row("run.name escapes out_dir", "train.main", lambda w, d: w.gpt("run.name=../../x"),
        ("run.name='../../x': expected a plain name",)),
    Row("run.name empty", "train.main", lambda w, d: w.gpt("run.name="),
        ("run.name='': expected a plain name",)),
    Row("data.path a mapping", "train.main", lambda w, d: w.gpt("data.path={a:1}"),
        ("data.path=", "expected str")),
    Row("unquoted path with parentheses", "train.main",
        lambda w, d: w.gpt(f"trainer.init_from={d}/ckpt (1).pt"), ("quote it:", "ckpt (1).pt'")),
    Row("a state larger than the machine", "train.main",
        lambda w, d: w.trm("model.hidden_size=1048576"), ("alone needs", "TiB per device")),
    # -- train.main: data --
    Row("dataset.json string seq_len", "train.main",
        lambda w, d: w.trm(f"data.path={_dataset_json(w, d, 'train', _field('seq_len', '81'))}"),
        ("data.path:", "train/dataset.json: seq_len: expected a non-negative integer, got '81'")),
    Row("dataset.json negative vocab", "train.main",
        lambda w, d: w.trm(f"data.path={_dataset_json(w, d, 'train', _field('vocab_size', -3))}"),
        ("vocab_size: expected a non-negative integer, got -3",)),
    Row("dataset.json vocab 1e12", "train.main",
        lambda w, d: w.trm(f"data.path={_dataset_json(w, d, 'train', _field('vocab_size', 10**12))}"),
        ("alone needs",)),
    Row("dataset.json not JSON", "train.main",
        lambda w, d: w.trm(f"data.path={_dataset_json(w, d, 'train', lambda t: '{not json')}"),
        ("train/dataset.json: dataset.json: not valid JSON",)),
    Row("data.build over a folder it did not build", "train.main",
        lambda w, d: w.trm(f"data.path={_not_ours(w, d)}"),
        ("data.build=sudoku_easy", "NOTES.md", "not replaced")),
    # -- train.main: files --
    Row("init_from a damaged .safetensors", "train.main",
        lambda w, d: (_write(f"{d}/w.safetensors", "not safetensors" * 9),
                      w.gpt(f"trainer.init_from={d}/w.safetensors"))[1],
        ("trainer.init_from=", "not a safetensors file, or a damaged one",)),
    Row("init_from a torch file that runs code", "train.main",
        lambda w, d: w.gpt(f"trainer.init_from={_torch_file(d, 'x.pt', {'m': _payload(d)})}"),
        ("refusing to load", "x.pt: it asks to run code (GLOBAL posix.system)"), needs=T,
        marker=True),
    Row("a step directory that is a link", "train.main", _linked_step,
        ("checkpoints/8 is a symbolic link",)),
    Row("gs:// without gcsfs", "train.main", lambda w, d: w.gpt("run.out_dir=gs://bucket/runs"),
        ("run.out_dir=gs://bucket/runs: a Cloud Storage path needs gcsfs", "'.[gcs]'"),
        absent=("gcsfs",)),
    # -- train.evaluate --
    Row("all_config.yaml with a Python tag", "train.evaluate",
        lambda w, d: [_upstream_with(w, d, f'arch: !!python/object/apply:os.system ["touch {d}/{MARKER}"]\n')],
        ("refusing to load", "all_config.yaml: it asks to run code", "python/object/apply"),
        needs=T, marker=True),
    Row("all_config.yaml broken", "train.evaluate",
        lambda w, d: [_upstream_with(w, d, "arch: {name: [unclosed\n")],
        ("all_config.yaml: not a YAML file this reads",), needs=T),
    Row("all_config.yaml a list", "train.evaluate",
        lambda w, d: [_upstream_with(w, d, "- a\n- b\n")],
        ("all_config.yaml: expected a mapping", "got a list"), needs=T),
    Row("all_config.yaml data_paths a mapping", "train.evaluate",
        lambda w, d: [_upstream_with(w, d, "data_paths: {a: 1}\n")],
        ("all_config.yaml: data_paths: expected a list of data set paths",), needs=T),
    Row("--data with a string seq_len", "train.evaluate",
        lambda w, d: [w.trm_run, "--data", _dataset_json(w, d, "test", _field("seq_len", "81"))],
        ("--data:", "test/dataset.json: seq_len: expected a non-negative integer",)),
    Row("--data not JSON", "train.evaluate",
        lambda w, d: [w.trm_run, "--data", _dataset_json(w, d, "test", lambda t: "[")],
        ("test/dataset.json: dataset.json: not valid JSON",)),
    Row("a torch file that runs code", "train.evaluate",
        lambda w, d: [_torch_file(d, "x.pt", {"model_args": _payload(d)})],
        ("refusing to load", "it asks to run code (GLOBAL posix.system)"), needs=T, marker=True),
    Row("a step's metadata that never ends", "train.evaluate", _endless,
        ("no checkpoint of 8", "restores")),
    Row("gs:// without gcsfs", "train.evaluate", lambda w, d: ["gs://bucket/runs/x"],
        ("SOURCE=gs://bucket/runs/x: a Cloud Storage path needs gcsfs",), absent=("gcsfs",)),
    # -- train.export / train.sample --
    Row("a damaged config.yaml", "train.export",
        lambda w, d: [_run_with(w.trm_run, d, lambda r: _write(f"{r}/config.yaml", "model: [\n")),
                      "--out", f"{d}/out.pt"],
        ("config.yaml: does not parse",), needs=T),
    Row("a meta.pkl that runs code", "train.sample", lambda w, d: [_unsafe_meta_pkl(w, d)],
        ("refusing to load", "meta.pkl: it asks to run code (GLOBAL posix.system)"), marker=True),
    Row("GPT-2 BPE without tiktoken", "train.sample", lambda w, d: [_no_meta_ckpt(w, d)],
        ("needs tiktoken: pip install tiktoken",), absent=("tiktoken",), needs=T),
    Row("--out where nothing can be written", "train.export",
        lambda w, d: [w.trm_run, "--out", "/proc/out.pt"], ("--out /proc/out.pt: cannot be written",),
        needs=T),
    Row("an option's value of the wrong type", "train.evaluate",
        lambda w, d: [w.trm_run, "--step", "abc"],
        ("argument --step: invalid int value: 'abc'", "python -m train.evaluate --help")),
    # -- the data builders' commands --
    Row("a builder over a folder of other things", "data.sudoku_easy",
        lambda w, d: ["--output-dir", _not_ours(w, d), "train=4", "test=4", "blanks=8",
                      "num_aug=0"],
        ("holds NOTES.md", "not replaced")),
]  # fmt: skip


def _command(name: str) -> Callable:
    import importlib

    if name.startswith("data."):
        from data import cli

        main = importlib.import_module(name).main
        return lambda argv: cli.run(main, argv)
    return importlib.import_module(name).main


def _without_lock(files: dict) -> dict:
    """A snapshot less the empty lock file a trainer leaves in a run directory it claimed (a
    directory it made is removed whole when it stops before writing: train/rundir.py)."""
    return {p: h for p, h in files.items() if not (p.endswith("/" + LOCK_FILE) and h == _EMPTY)}


def _unclaimed(root: str) -> dict:
    return _without_lock(snapshot(root))


_EMPTY = hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.command}: {r.id}" for r in ROWS])
def test_bad_input_is_one_line_and_touches_nothing(row, world, tmp_path, monkeypatch, capfd):
    for module in row.needs:
        pytest.importorskip(module)
    d = str(tmp_path)
    argv = row.argv(world, d)
    for module in row.absent:
        monkeypatch.setitem(sys.modules, module, None)  # `import gcsfs` raises ImportError
    before = snapshot(world.root), snapshot(d)
    with pytest.raises(SystemExit) as e:
        _command(row.command)(argv)
    out, err = capfd.readouterr()
    code = e.value.code  # sys.exit("error: ...") (status 1), or argparse's status 2 and stderr
    line = code if isinstance(code, str) else err.rstrip("\n").rpartition("\n")[2]
    assert code not in (0, None) and line.startswith("error: "), (code, err[-2000:])
    assert "\n" not in line and line not in out, line
    for words in row.expect:
        assert words in line, line
    assert "Traceback" not in out + err, err[-3000:]
    assert (_unclaimed(world.root), _unclaimed(d)) == tuple(map(_without_lock, before))
    assert not os.path.exists(os.path.join(d, MARKER)), "the payload ran"
