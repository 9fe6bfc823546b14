"""The data of a GPT run: the `data` section (GPTDataConfig), building shakespeare_char on first
use, the checks that a text data set fits the model, and the resumable train iterator.

    meta = prepare_data(cfg.data)            # built when data.build says so; meta.json's entries
    check_text_data(path, model_cfg, "data.path")
    it = train_iterator(path, block_size=T, global_batch_size=B * accum, seed=s, local_batch=f)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import numpy as np

from data import provenance
from data.download import DownloadError
from data.provenance import NotReplaced
from data.shakespeare_char import build as build_shakespeare_char
from data.shakespeare_char import build_record
from data.text_source import read_meta, read_token_bin, train_dataset
from models.fields import ranged
from train.errors import ConfigError, one_line
from train.task import build_once

log = logging.getLogger(__name__)


@dataclasses.dataclass
class GPTDataConfig:
    """The `data` section of a text data set (configs/data/shakespeare_char.yaml, openwebtext)."""

    path: str = ""  # a directory with train.bin / val.bin / meta.json (data.text_source)
    build: str | None = None  # shakespeare_char: built into `path` when it has no train.bin
    input: str = ""  # the builder's input.txt (empty: downloaded); read only when building
    sample_tokens: int = ranged(0, ">=0")  # characters generated at each eval (0: none)
    # Micro-batches per optimiser step (global, as nanoGPT): the batch the data yields is
    # [gradient_accumulation_steps, batch, block]. nanoGPT's train.py lists it under `# data`.
    gradient_accumulation_steps: int = ranged(1, ">0")
    # batches per split of each evaluation (nanoGPT's estimate_loss); > 0 with
    # trainer.eval_interval > 0
    eval_iters: int = ranged(0, ">=0")


def prepare_data(d: dict) -> dict:
    """The data set of the `data` section `d`, built first when data.build names a builder and
    data.path holds none yet, or holds one its build record says was built from another input
    (data.provenance.prepare): -> its meta.json entries ({} without one)."""
    path = d.get("path", "")
    if not path:
        raise ConfigError("data.path: directory with train.bin / val.bin / meta.json is required")
    builder, given = d.get("build"), d.get("input") or None
    if builder is None and os.path.exists(os.path.join(path, "train.bin")):
        return _meta(path)
    if builder != "shakespeare_char":
        raise ConfigError(
            f"data.path={path!r} has no train.bin; build it first (python -m data.<name>)"
        )
    what = f"data.build={builder} from " + (f"data.input={given}" if given else "a download")
    try:
        wanted = build_record(given)
        provenance.prepare(
            path,
            what,
            wanted,
            # a data set, read as it is: its val.bin and vocabulary are checked next (validate_data)
            lambda p: os.path.exists(os.path.join(p, "train.bin")),
            lambda: build_once(
                "gpt_data_built",
                lambda: build_shakespeare_char(path, input_path=given, built_by=wanted),
            ),
        )
    except NotReplaced as e:
        raise ConfigError(f"data.path={path!r} ({what}): {e}") from e
    except DownloadError as e:  # the builder's own hint names its CLI flag, not our key
        raise ConfigError(
            f"data.path={path!r}: building it ({what}) could not download {e.url} ({e.reason}); "
            "offline? set data.input=path/to/input.txt (tiny-shakespeare's input.txt)"
        ) from e
    except (OSError, ValueError) as e:  # data.input missing or unreadable
        raise ConfigError(
            f"data.path={path!r}: building it from data.input={given!r} failed: {one_line(e)}"
        ) from e
    return _meta(path)


def _meta(path: str) -> dict:
    try:
        return read_meta(path)
    except FileNotFoundError:
        return {}


def check_text_data(data_dir: str, model_cfg, option: str) -> None:
    """ConfigError (naming `option`) unless train.bin and val.bin open as uint16 tokens, hold
    more than one window, and their tokens (val: all; train: the first 2**20) are below the
    model's vocab_size."""
    vocab, need = model_cfg.vocab_size, model_cfg.block_size + 2
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        try:
            tokens = read_token_bin(path)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{option}: {e}") from e
        if len(tokens) < need:
            raise ConfigError(
                f"{option}: {path} has {len(tokens)} tokens; model.block_size="
                f"{model_cfg.block_size} needs at least {need}"
            )
        top = int(np.max(tokens[: 1 << 20] if split == "train" else tokens))
        if top >= vocab:
            raise ConfigError(
                f"{option}: {path} has token id {top}, not below the model's vocab_size="
                f"{vocab} (meta.json vocab_size or model.vocab_size)"
            )


def train_iterator(
    data_dir: str, *, block_size: int, global_batch_size: int, seed: int, local_batch
):
    """data.text_source's resumable windows of train.bin, each batch mapped by `local_batch`."""
    ds = train_dataset(
        os.path.join(data_dir, "train.bin"),
        block_size=block_size,
        global_batch_size=global_batch_size,
        seed=seed,
    )
    return _Mapped(iter(ds), local_batch)


class _Mapped:
    """An iterator with Grain's get_state/set_state that maps each element (state passes through)."""

    def __init__(self, it, fn):
        self.it, self.fn = it, fn

    def __iter__(self):
        return self

    def __next__(self):
        return self.fn(next(self.it))

    # Grain's Orbax handler JSON-encodes DatasetIterator states itself but expects bytes from
    # any other iterator; we are "any other", so encode the wrapped iterator's dict here.
    def get_state(self) -> bytes:
        return json.dumps(self.it.get_state()).encode()

    def set_state(self, state):
        self.it.set_state(json.loads(state) if isinstance(state, str | bytes) else state)

    def start_prefetch(self):  # called by Grain's restore
        getattr(self.it, "start_prefetch", lambda: None)()
