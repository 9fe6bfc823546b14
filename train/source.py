"""Open any checkpoint this project reads into (config, task, state, step): the one way in for
`python -m train.evaluate`, `train.sample` and `train.export`.

    src = open_source("runs/trm_sudoku")                  # a run directory, local or gs://
    src = open_source("ckpt/step_65100", data="sudoku")   # upstream TRM (+ all_config.yaml beside it)
    src = open_source("out-shakespeare-char/ckpt.pt")     # a nanoGPT ckpt.pt
    src = open_source("gpt2/model.safetensors")           # HF GPT-2 weights
    src.kind, src.cfg, src.task, src.state, src.step, src.meta

A run directory restores its checkpoint (the latest, or `step`) onto the task its config.yaml
describes; the trainer records the data-derived sizes there (vocabulary, sequence length, puzzle
identifiers), so the run's data set need not be on disk. A weights file becomes a fresh state of
the matching task with those weights imported (Task.import_weights), its architecture from the
file itself: nanoGPT's `model_args`, upstream TRM's `all_config.yaml` beside it (or `overrides`
such as `+experiment=trm_sudoku`) with vocabulary and identifiers from its own tables, HF GPT-2's
`config.json` beside it or the GPT-2 preset of its width and depth. Every input problem is one
SourceError line naming the file or option and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
from etils import epath
from omegaconf import OmegaConf, open_dict

from train import families
from train import jit as jit_lib
from train.checkpoint import Checkpointer
from train.compose import apply_overrides, load_config, load_run_config, validate
from train.errors import ConfigError, one_line
from train.mesh import check_backend, make_mesh

KINDS = ("run", "nanogpt", "upstream_trm", "hf_gpt2")
_NAMES = {
    "run": "a run directory",
    "nanogpt": "a nanoGPT ckpt.pt",
    "upstream_trm": "an upstream TRM checkpoint",
    "hf_gpt2": "an HF GPT-2 .safetensors file",
}


class SourceError(ConfigError):
    """A SOURCE (or an option that goes with it) that cannot be opened; one line."""


@dataclasses.dataclass
class Source:
    kind: str  # one of KINDS
    path: str
    cfg: Any  # the composed config: the run's config.yaml, or the one the file describes
    task: Any  # train.task.Task built from cfg
    state: Any  # the task's full state (weights files: a fresh optimizer around the weights)
    step: int | None  # a run's checkpoint step; nanoGPT's iter_num; None otherwise
    meta: dict  # a run's checkpoint meta (best metric, ...); a nanoGPT ckpt.pt's other entries
    trained_on: str | None = None  # the data set the weights were trained on, where known


def open_source(
    path: str,
    *,
    step: int | None = None,
    data: str | None = None,
    overrides=(),
    single_device: bool = False,
    kinds=KINDS,
) -> Source:
    """The Source at `path` (see the module docstring). `step`: a run directory's checkpoint
    (default the latest). `data`: a weights file's data set (nanoGPT: its vocabulary must be the
    file's; upstream TRM: its test split gives seq_len); a run directory reads none. `overrides`:
    key=value (`mesh=NAME` too) for a run directory, Hydra overrides (`+experiment=NAME`,
    `model.x=...`) for a weights file. `single_device`: the task on one device (sampling),
    whatever mesh the config names. `kinds`: the kinds the caller takes (others: SourceError)."""
    if data is not None and not epath.Path(data).exists():
        raise SourceError(f"--data {data}: no such file or directory")
    kind, loaded = _kind(path)
    if kind not in kinds:
        raise SourceError(
            f"{path}: {_NAMES[kind]}; expected {' or '.join(_NAMES[k] for k in kinds)}"
        )
    if step is not None and kind != "run":
        raise SourceError(f"--step {step}: only a run directory has steps ({path} is a file)")
    if kind == "run":
        return _open_run(path, step, list(overrides), single_device)
    trained_on, meta = None, {}
    if kind == "nanogpt":
        cfg = _gpt_config(path, _nanogpt_model(path, loaded), data, list(overrides))
        meta = {k: v for k, v in loaded.items() if k not in ("model", "optimizer")}
    elif kind == "hf_gpt2":
        cfg = _gpt_config(path, _hf_model(path, loaded), data, list(overrides))
    else:
        cfg, trained_on = _upstream_trm_config(path, loaded, data, list(overrides))
    task = _make_task(cfg, single_device, need_data=cfg.task == "gpt" and data is not None)
    if "vocab_size" in meta.get("model_args", {}):
        _check_vocab(path, int(meta["model_args"]["vocab_size"]), task, data)
    try:
        state = task.import_weights(task.create_state(), path)
    except (KeyError, ValueError) as e:
        raise SourceError(f"{path}: does not fit the config ({one_line(e)})") from e
    return Source(kind, path, cfg, task, state, meta.get("iter_num"), meta, trained_on)


# --- which kind ------------------------------------------------------------------------------
def _kind(path: str) -> tuple[str, Any]:
    """(kind, the loaded file or None). A directory or a URL is a run directory."""
    if "://" in path or os.path.isdir(path):
        if not (epath.Path(path) / "config.yaml").exists():
            raise SourceError(
                f"{path}: a directory without config.yaml; expected a run directory of "
                "python -m train.main (config.yaml + checkpoints/), or a checkpoint file"
            )
        return "run", None
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such file or run directory")
    from models.state_dict import StateDictError, UnsafeCheckpointError, load_file

    try:
        loaded = load_file(path)
    except (StateDictError, UnsafeCheckpointError) as e:
        raise SourceError(one_line(e)) from e
    except Exception as e:  # not a torch / safetensors file at all
        raise SourceError(f"{path}: unknown kind ({one_line(e, 200)}); {_EXPECTED}") from e
    if path.endswith(".safetensors"):
        return "hf_gpt2", loaded
    if isinstance(loaded, dict) and "model_args" in loaded:
        return "nanogpt", loaded
    keys = [k.removeprefix("_orig_mod.") for k in loaded] if isinstance(loaded, dict) else []
    if keys and all(k.startswith("model.") for k in keys):
        return "upstream_trm", loaded
    raise SourceError(f"{path}: unknown kind; {_EXPECTED}")


_EXPECTED = (
    "expected a run directory, a nanoGPT ckpt.pt (with model_args), an upstream TRM checkpoint "
    "(a state_dict of model.* keys) or an HF GPT-2 .safetensors file"
)


# --- run directories -------------------------------------------------------------------------
def _open_run(path: str, step, overrides, single_device) -> Source:
    run_dir = epath.Path(path)
    try:
        cfg = load_run_config((run_dir / "config.yaml").read_text())
        apply_overrides(cfg, overrides)
    except ConfigError as e:
        raise SourceError(f"{path}/config.yaml: {e}") from e
    task = _make_task(cfg, single_device, need_data=False)
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint)
    try:
        steps = sorted(ckpt.manager.all_steps())
        if not steps:
            raise SourceError(f"{path}/checkpoints holds no checkpoint")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise SourceError(f"{path}: --step {step} not saved; checkpoints: {steps}")
        abstract = jit_lib.with_shardings(task.abstract_state, task.state_shardings)
        try:
            state, meta = ckpt.restore(step, abstract)
        except (ValueError, FileNotFoundError) as e:  # Orbax: shapes that do not fit
            raise SourceError(
                f"{path}/checkpoints/{step} does not restore onto the model of its config.yaml "
                f"{OmegaConf.to_container(cfg.model)} ({one_line(e, 300)})"
            ) from e
    finally:
        ckpt.close()
    return Source("run", path, cfg, task, state, int(step), dict(meta), cfg.data.get("path"))


def _make_task(cfg, single_device: bool, *, need_data: bool):
    """The task of `cfg` on its configured mesh, or on one device."""
    devices = None
    if single_device:
        with open_dict(cfg):
            cfg.mesh.update(data=1, fsdp=1, tensor=1, param_sharding="replicate")
        devices = jax.devices()[:1]
    try:
        mesh = make_mesh(cfg.mesh, devices)
        check_backend(cfg, mesh.devices.flat[0].platform)  # e.g. no float64 loss on a TPU
        families.enable_x64_if_needed(cfg)
        return families.make_task(cfg, mesh, need_data=need_data)
    except (ValueError, FileNotFoundError) as e:  # ConfigError included
        raise SourceError(one_line(e)) from e


# --- GPT weights files -------------------------------------------------------------------------
# The GPTConfig fields a nanoGPT ckpt.pt's model_args (or an HF config) gives.
_GPT_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


def _nanogpt_model(path: str, ckpt: dict) -> dict:
    args = ckpt.get("model_args")
    if not isinstance(args, dict):
        raise SourceError(f"{path}: model_args is not a dict")
    missing = [f for f in _GPT_FIELDS[:5] if f not in args]
    if missing:
        raise SourceError(f"{path}: model_args lacks {missing}")
    return {f: args[f] for f in _GPT_FIELDS if f in args}


def _hf_model(path: str, sd: dict) -> dict:
    """The GPT-2 architecture of an HF safetensors file: config.json beside it, else a preset."""
    from models.gpt import PRESETS

    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    if "wte.weight" not in sd or "wpe.weight" not in sd:
        raise SourceError(f"{path}: no wte.weight / wpe.weight, so it is not a GPT-2 weights file")
    vocab, n_embd = (int(n) for n in np.shape(sd["wte.weight"]))
    n_layer = len({k.split(".")[1] for k in sd if k.startswith("h.")})
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if os.path.isfile(beside):
        with open(beside, encoding="utf-8") as f:
            n_head = int(json.load(f)["n_head"])
    else:
        sizes = [p for p in PRESETS.values() if (p["n_embd"], p["n_layer"]) == (n_embd, n_layer)]
        if not sizes:
            raise SourceError(
                f"{path}: n_embd={n_embd}, n_layer={n_layer} is no GPT-2 size; put HF's "
                "config.json (with n_head) beside it"
            )
        n_head = sizes[0]["n_head"]
    block = int(np.shape(sd["wpe.weight"])[0])
    # HF GPT-2 was trained with the tanh GELU ("gelu_new")
    return dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block, bias=True,
                vocab_size=vocab, dropout=0.0, gelu_approximate=True)  # fmt: skip


def _gpt_config(path: str, model: dict, data: str | None, overrides: list[str]):
    """The config of a GPT weights file: an experiment (default gpt_shakespeare_char) with the
    file's architecture, float32 compute, `data` as its data set (never built here)."""
    base = [] if _has_experiment(overrides) else ["+experiment=gpt_shakespeare_char"]
    cfg = _compose(path, base + ["run.name=" + _name(path), "model.dtype=float32", *overrides])
    with open_dict(cfg):
        cfg.model.update(model)
        cfg.data.build = None
        if data is not None:
            cfg.data.path = data
    _validate(path, cfg)
    return cfg


def _check_vocab(path: str, vocab: int, task, data: str | None) -> None:
    if data is not None and vocab != task.model_cfg.vocab_size:
        raise SourceError(
            f"{path}: model_args vocab_size={vocab}, but --data {data} has "
            f"vocab_size={task.model_cfg.vocab_size}"
        )


# --- upstream TRM checkpoints ------------------------------------------------------------------
# upstream arch module names (config/arch/*.yaml `name`) -> TRMConfig.arch
_UPSTREAM_ARCH = {"trm_singlez", "trm_hier6", "transformers_baseline", "hrm", "trm"}
_UPSTREAM_MODEL_KEYS = (
    "H_cycles", "L_cycles", "H_layers", "L_layers", "hidden_size", "expansion", "num_heads",
    "pos_encodings", "rms_norm_eps", "rope_theta", "halt_max_steps", "halt_exploration_prob",
    "forward_dtype", "mlp_t", "puzzle_emb_ndim", "puzzle_emb_len", "no_ACT_continue",
    "act_enabled", "act_inference",
)  # fmt: skip


def upstream_overrides(all_config: dict) -> list[str]:
    """Our Hydra overrides for the run an upstream all_config.yaml describes (model from `arch`,
    loss type, batch size, EMA, data_paths[0], the ARC evaluator)."""
    arch = dict(all_config.get("arch") or {})
    module = str(arch.get("name", "recursive_reasoning.trm@")).split("@")[0].split(".")[-1]
    if module not in _UPSTREAM_ARCH:
        raise SourceError(
            f"all_config.yaml: arch.name={arch.get('name')!r} is not a known TRM arch"
        )
    out = ["task=trm", "model=trm", "optim=trm", "data=sudoku", f"model.arch={module}"]
    out += [f"model.{k}={arch[k]}" for k in _UPSTREAM_MODEL_KEYS if k in arch]
    loss = (arch.get("loss") or {}).get("loss_type")
    if loss:
        out.append(f"optim.loss_type={loss}")
    if "global_batch_size" in all_config:
        out.append(f"trainer.global_batch_size={int(all_config['global_batch_size'])}")
    if "ema" in all_config:
        out.append(f"optim.ema={bool(all_config['ema'])}")
    paths = all_config.get("data_paths_test") or all_config.get("data_paths") or []
    if paths:
        out.append(f"data.path={paths[0]}")
    if any("arc" in str(e.get("name", "")).lower() for e in all_config.get("evaluators") or []):
        out.append("+data.evaluator=arc")
    return out + ["run.name=upstream_eval", "trainer.epochs=1", "data.eval_interval_epochs=1"]


def _upstream_trm_config(path: str, state_dict: dict, data: str | None, overrides: list[str]):
    """-> (cfg, the data set the run trained on): all_config.yaml beside the checkpoint (then
    `overrides`), or `overrides` alone naming an experiment; vocabulary and puzzle identifiers
    from the checkpoint's own tables, seq_len from the data set's test split."""
    import yaml

    from models.trm.params import PUZZLE_KEY

    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "all_config.yaml")
    base = []
    if os.path.isfile(beside):
        with open(beside) as f:
            base = upstream_overrides(yaml.safe_load(f) or {})
    elif not _has_experiment(overrides):
        raise SourceError(
            f"{path}: no all_config.yaml beside it; pass the run's config as overrides, "
            "e.g. +experiment=trm_sudoku (and model.* / data.path=...)"
        )
    trained = [o.split("=", 1)[1] for o in base + overrides if o.startswith("data.path=")]
    cfg = _compose(path, base + overrides + ([f"data.path={data}"] if data is not None else []))
    sd = {k.removeprefix("_orig_mod."): v for k, v in state_dict.items()}
    vocab, table = sd.get("model.inner.embed_tokens.embedding_weight"), sd.get(PUZZLE_KEY)
    from train.families.trm.task import test_metadata

    meta = test_metadata(cfg.data.path)
    with open_dict(cfg.data):
        cfg.data.seq_len = meta.seq_len
        cfg.data.vocab_size = int(vocab.shape[0]) if vocab is not None else meta.vocab_size
        cfg.data.num_puzzle_identifiers = (
            int(table.shape[0]) if table is not None else meta.num_puzzle_identifiers
        )
    return cfg, (trained[-1] if trained else None)


# --- shared ------------------------------------------------------------------------------------
def _has_experiment(overrides) -> bool:
    return any(o.startswith("+experiment=") for o in overrides)


def _name(path: str) -> str:
    return os.path.basename(os.path.abspath(path)).replace("=", "_") or "checkpoint"


def _compose(path: str, overrides: list[str]):
    try:
        return load_config(overrides)
    except ConfigError as e:
        raise SourceError(f"{path}: {e}") from e


def _validate(path: str, cfg) -> None:
    try:
        validate(cfg)
    except ConfigError as e:
        raise SourceError(f"{path}: {e}") from e
