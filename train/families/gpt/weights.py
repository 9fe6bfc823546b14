"""nanoGPT's checkpoint files that train/source.py opens (train.evaluate, train.sample,
train.export): a nanoGPT ckpt.pt (its `model_args` give the architecture) and an HF GPT-2
.safetensors file (config.json beside it, or the GPT-2 preset of its width and depth). Either
becomes a config of the GPT task with the file's architecture; Task.import_weights loads it.
"""

from __future__ import annotations

import json
import os

import numpy as np
from omegaconf import open_dict

from models.gpt import PRESETS
from train.compose import override
from train.errors import one_line
from train.source import SourceError, compose_for, has_experiment, run_name_for, validate_for
from train.task import Opened, WeightsFile

# The GPTConfig fields a nanoGPT ckpt.pt's model_args (or an HF config) gives.
_GPT_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


class NanoGPTCheckpoint(WeightsFile):
    kind = "nanogpt"
    description = "a nanoGPT ckpt.pt"

    def detect(self, path: str, loaded) -> bool:
        return isinstance(loaded, dict) and "model_args" in loaded

    def open(self, path, loaded, data, overrides) -> Opened:
        args = loaded.get("model_args")
        if not isinstance(args, dict):
            raise SourceError(f"{path}: model_args is not a dict")
        missing = [f for f in _GPT_FIELDS[:5] if f not in args]
        if missing:
            raise SourceError(f"{path}: model_args lacks {missing}")
        model = {f: args[f] for f in _GPT_FIELDS if f in args}
        meta = {k: v for k, v in loaded.items() if k not in ("model", "optimizer")}
        cfg = gpt_config(path, model, data, overrides)
        return Opened(cfg, need_data=data is not None, step=meta.get("iter_num"), meta=meta)

    def check(self, path, loaded, task, data) -> None:
        vocab = int(loaded["model_args"].get("vocab_size", task.model_cfg.vocab_size))
        if data is not None and vocab != task.model_cfg.vocab_size:
            raise SourceError(
                f"{path}: model_args vocab_size={vocab}, but --data {data} has "
                f"vocab_size={task.model_cfg.vocab_size}"
            )


class HFGPT2File(WeightsFile):
    kind = "hf_gpt2"
    description = "an HF GPT-2 .safetensors file"

    def detect(self, path: str, loaded) -> bool:
        return path.endswith(".safetensors")

    def open(self, path, loaded, data, overrides) -> Opened:
        cfg = gpt_config(path, _hf_model(path, loaded), data, overrides)
        return Opened(cfg, need_data=data is not None)


def _hf_model(path: str, sd: dict) -> dict:
    """The GPT-2 architecture of an HF safetensors file: config.json beside it, else a preset."""
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    if "wte.weight" not in sd or "wpe.weight" not in sd:
        raise SourceError(f"{path}: no wte.weight / wpe.weight, so it is not a GPT-2 weights file")
    vocab, n_embd = (int(n) for n in np.shape(sd["wte.weight"]))
    n_layer = len({k.split(".")[1] for k in sd if k.startswith("h.")})
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if os.path.isfile(beside):
        try:
            with open(beside, encoding="utf-8") as f:
                n_head = json.load(f).get("n_head")
        except (OSError, ValueError, AttributeError) as e:  # not JSON, not an object
            raise SourceError(f"{beside}: not an HF config.json ({one_line(e, 200)})") from e
        if not isinstance(n_head, int) or isinstance(n_head, bool) or n_head < 1:
            raise SourceError(
                f"{beside}: n_head: expected a positive whole number, got {n_head!r:.80}"
            )
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


def gpt_config(path: str, model: dict, data: str | None, overrides: list[str]):
    """The config of a GPT weights file: an experiment (default gpt_shakespeare_char) with the
    file's architecture, float32 compute, `data` as its data set (never built here)."""
    base = [] if has_experiment(overrides) else ["+experiment=gpt_shakespeare_char"]
    cfg = compose_for(
        path, base + [override("run.name", run_name_for(path)), "model.dtype=float32", *overrides]
    )
    with open_dict(cfg):
        cfg.model.update(model)
        cfg.data.build = None
        if data is not None:
            cfg.data.path = data
    validate_for(path, cfg)
    return cfg
