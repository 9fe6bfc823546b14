"""Token bins (nanoGPT's uint16 `train.bin` / `val.bin`) and Grain pipelines over them.

API
  write_token_bin(path, chunks) -> int        atomic write of uint16 tokens (iterable of arrays)
  read_token_bin(path) -> np.memmap            uint16, read-only
  write_meta_json(path, meta) / read_meta(dir_or_file) -> dict
      read_meta prefers meta.json; a nanoGPT meta.pkl is read with a restricted unpickler that
      refuses every class or function (only dict/str/int literals load).
  TokenWindows(path, block_size)               grain RandomAccessDataSource: offset -> {x, y}
  train_dataset(path, *, block_size, global_batch_size, seed, process_index=None,
                process_count=None) -> grain.IterDataset of {"x", "y"} int32 [local_batch, T]
  eval_dataset(path, *, block_size, global_batch_size, num_batches, seed=..., ...) -> same,
      finite and identical on every call (the windows depend only on the seed).

Sampling follows nanoGPT's `get_batch`: window starts are uniform on [0, len - block_size), with
replacement and no epochs, y is x shifted by one. Unlike nanoGPT the draws are a pure function of
(seed, batch index): batch b draws its whole GLOBAL batch from Generator(PCG64((seed, b))) and
process p keeps rows [p*L, (p+1)*L). So the global batch does not depend on how many processes
read it, every row of it is read by exactly one process, and resuming needs only the batch index,
which is what the Grain iterator's get_state() holds.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from data.process_rows import process_rows

if TYPE_CHECKING:  # imported inside the Grain functions: bin writers stay light
    import grain

TOKEN_DTYPE = np.uint16  # nanoGPT's on-disk dtype; GPT-2's 50257 ids fit
_EVAL_SEED_OFFSET = (
    1_000_003  # eval windows must not replay the first train batches (same run seed)
)


class UnsafePickleError(ValueError):
    """A meta.pkl asked to build an object: we only accept plain dict/str/int data."""


# ---------------------------------------------------------------------------------------------
# files


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_token_bin(path: str | os.PathLike, chunks: Iterable[np.ndarray]) -> int:
    """Stream uint16 token chunks to `path` atomically: write a temp file beside it, check its size
    against the count written, then rename. Returns the token count. Values must be < 65536."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    n = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                chunk = np.asarray(chunk)
                if chunk.size and (chunk.min() < 0 or chunk.max() > np.iinfo(TOKEN_DTYPE).max):
                    raise ValueError(
                        f"{path}: token ids must be in [0, 65535] for a uint16 bin, got range "
                        f"[{chunk.min()}, {chunk.max()}]"
                    )
                chunk.astype(TOKEN_DTYPE).tofile(f)
                n += chunk.size
            f.flush()
            os.fsync(f.fileno())
        size = tmp.stat().st_size
        if size != n * TOKEN_DTYPE().itemsize:
            raise OSError(f"{tmp}: wrote {size} bytes, expected {n * 2} (disk full?)")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n


def read_token_bin(path: str | os.PathLike) -> np.memmap:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"token bin {path} does not exist (run a data.<name> builder)")
    size = path.stat().st_size
    if size % 2:
        raise ValueError(f"{path}: {size} bytes is not a whole number of uint16 tokens")
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r")


def write_meta_json(path: str | os.PathLike, meta: dict) -> None:
    path = Path(path)
    tmp = _tmp_path(path)
    tmp.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class _DataOnlyUnpickler(pickle.Unpickler):
    # dict, str and int have their own pickle opcodes; any class or function reference (the way
    # a pickle runs code) goes through find_class, so refusing it refuses all code.
    def __init__(self, f, path: str):
        super().__init__(f)
        self.path = path

    def find_class(self, module, name):
        raise UnsafePickleError(
            f"refusing to load {self.path}: it asks to run code (GLOBAL {module}.{name}); a "
            "meta.pkl holds plain dict/str/int data only"
        )


def _check_meta(meta, where: str) -> dict:
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: expected a dict, got {type(meta).__name__}")
    if "vocab_size" in meta and not isinstance(meta["vocab_size"], int):
        raise ValueError(f"{where}: 'vocab_size' must be an int, got {meta['vocab_size']!r}")
    for key in ("stoi", "itos"):
        if key in meta and not isinstance(meta[key], dict):
            raise ValueError(f"{where}: '{key}' must be a dict, got {type(meta[key]).__name__}")
    return meta


def read_meta(path: str | os.PathLike) -> dict:
    """Read a dataset's meta: `path` is meta.json, meta.pkl, or a folder holding either (JSON
    preferred). Returns nanoGPT's form: {'vocab_size': int, 'itos': {int: str}, 'stoi': {str: int}}
    for character-level data; BPE bins (data.openwebtext) carry no 'vocab_size' (see there)."""
    path = Path(path)
    if path.is_dir():
        path = path / "meta.json" if (path / "meta.json").exists() else path / "meta.pkl"
    if path.suffix == ".json":
        meta = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(meta.get("itos"), list):  # JSON keys are strings: itos is stored as a list
            meta["itos"] = dict(enumerate(meta["itos"]))
        return _check_meta(meta, str(path))
    if path.suffix == ".pkl":
        with open(path, "rb") as f:
            return _check_meta(_DataOnlyUnpickler(f, str(path)).load(), str(path))
    raise ValueError(f"{path}: expected meta.json or meta.pkl")


# ---------------------------------------------------------------------------------------------
# Grain


class TokenWindows:
    """Random access to every (x, y) window of a token bin: record i is the block starting at
    token i. The memmap is opened lazily so the source pickles into Grain worker processes.
    (Grain's RandomAccessDataSource is a Protocol: no base class needed, and builders that only
    write bins never import grain and jax.)"""

    def __init__(self, path: str | os.PathLike, block_size: int):
        self.path = str(path)
        self.block_size = int(block_size)
        self._tokens = None
        n = read_token_bin(self.path).shape[0]
        if n <= self.block_size:
            raise ValueError(
                f"{self.path}: {n} tokens, need more than block_size={self.block_size}"
            )
        self._len = n - self.block_size  # nanoGPT: randint(len(data) - block_size)

    @property
    def tokens(self) -> np.memmap:
        if self._tokens is None:
            self._tokens = read_token_bin(self.path)
        return self._tokens

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None}

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, offset):
        offset = int(offset)
        if not 0 <= offset < self._len:
            raise IndexError(f"window start {offset} outside [0, {self._len})")
        w = np.asarray(self.tokens[offset : offset + self.block_size + 1], dtype=np.int32)
        return {"x": w[:-1], "y": w[1:]}

    def windows(self, offsets: np.ndarray) -> dict[str, np.ndarray]:
        """Gather a batch of windows: x, y int32 [len(offsets), block_size]."""
        idx = np.asarray(offsets, dtype=np.int64)[:, None] + np.arange(self.block_size + 1)
        w = np.asarray(self.tokens[idx], dtype=np.int32)
        return {"x": w[:, :-1], "y": w[:, 1:]}

    def __repr__(self) -> str:  # part of Grain's checkpointed state: keep it stable
        return f"TokenWindows(path={self.path!r}, block_size={self.block_size})"


class _DrawBatch:
    """Batch index -> this process's rows of the global batch drawn for it."""

    def __init__(self, source: TokenWindows, seed: int, global_batch_size: int, lo: int, hi: int):
        self.source, self.seed, self.global_batch_size = source, int(seed), int(global_batch_size)
        self.lo, self.hi = lo, hi

    def offsets(self, batch_index: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.seed, int(batch_index)]))
        return rng.integers(0, len(self.source), size=self.global_batch_size)[self.lo : self.hi]

    def __call__(self, batch_index):
        return self.source.windows(self.offsets(batch_index))


def train_dataset(
    path: str | os.PathLike,
    *,
    block_size: int,
    global_batch_size: int,
    seed: int,
    process_index: int | None = None,
    process_count: int | None = None,
    num_batches: int | None = None,
) -> grain.IterDataset:
    """Endless (or `num_batches`) random-window batches for this JAX process. Iterate with
    `it = iter(ds)`; `it.get_state()` / `it.set_state(state)` resume exactly."""
    import grain

    lo, hi = process_rows(global_batch_size, process_index, process_count)
    draw = _DrawBatch(TokenWindows(path, block_size), seed, global_batch_size, lo, hi)
    ds = grain.MapDataset.range(num_batches if num_batches is not None else 2**62)
    return ds.map(draw).to_iter_dataset()


def eval_dataset(
    path: str | os.PathLike,
    *,
    block_size: int,
    global_batch_size: int,
    num_batches: int,
    seed: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
) -> grain.IterDataset:
    """`num_batches` fixed batches: the same windows on every call, so eval losses of different
    steps are comparable. (nanoGPT's estimate_loss draws fresh random batches each time; its
    numbers are noisier.)"""
    return train_dataset(
        path,
        block_size=block_size,
        global_batch_size=global_batch_size,
        seed=seed + _EVAL_SEED_OFFSET,
        process_index=process_index,
        process_count=process_count,
        num_batches=num_batches,
    )
