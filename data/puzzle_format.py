"""Upstream TRM/HRM puzzle data set layout on disk: write it, read it back, and validate it.

Layout (one directory per built data set)::

    <root>/identifiers.json                  list: puzzle identifier -> name (index 0 = "<blank>")
    <root>/<split>/dataset.json              PuzzleDatasetMetadata, split in {"train", "test"}
    <root>/<split>/<set>__inputs.npy         [N_examples, seq_len] integer tokens
    <root>/<split>/<set>__labels.npy         [N_examples, seq_len] integer tokens
    <root>/<split>/<set>__puzzle_identifiers.npy  [N_puzzles] int32
    <root>/<split>/<set>__puzzle_indices.npy      [N_puzzles + 1] int32, CSR offsets into examples
    <root>/<split>/<set>__group_indices.npy       [N_groups + 1] int32, CSR offsets into puzzles
    <root>/<extra>.json                      optional builder extras (ARC: test_puzzles.json)

``<set>`` is always ``"all"`` in upstream builders. A *group* is an original puzzle together with
its augmentations; a *puzzle* owns one or more examples (ARC demonstrations; Sudoku/Maze: one).

API
---
- ``PuzzleDatasetMetadata``: the ``dataset.json`` fields, upstream's names.
- ``PuzzleArrays``: the five arrays of one set, with ``validate(metadata, where)``.
- ``PuzzleSplit``: ``metadata`` + ``sets: dict[str, PuzzleArrays]`` for one split.
- ``make_metadata(arrays, ...)``: metadata whose counts are derived from the arrays.
- ``write_dataset(root, splits, identifiers, extra_json=None, overwrite=False)``: atomic writer.
- ``load_split(root, split, mmap=False, raw=False)``: validating loader. By default returns int32
  arrays with ``labels == ignore_label_id`` replaced by ``IGNORE_LABEL`` (-100), which is what
  upstream's collate does to every batch; ``raw=True`` returns the arrays exactly as stored.
  ``mmap=True`` (implies raw storage dtype) memory-maps inputs/labels for data sets that do not fit
  in RAM as int32; ``collate`` then does the cast and mapping per batch.
- ``collate(inputs, labels, metadata)``: int32 cast + ignore-label mapping of a batch (idempotent).
- ``load_identifiers(root)``; ``PuzzleFormatError`` (a ``ValueError``) names file and field.

Upstream's PuzzleDataset loads what ``write_dataset`` writes: inputs/labels are stored as uint8
when every token fits (what upstream's ARC/Maze/Sudoku-test builders write; upstream Sudoku-train
happens to be int64), index arrays as int32, exactly as upstream stores them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from data import provenance

SPLITS = ("train", "test")
FIELDS = ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices")
IGNORE_LABEL = -100  # torch cross-entropy's default ignore_index; upstream maps to it at collate
BLANK_IDENTIFIER_NAME = "<blank>"
_INDEX_FIELDS = ("puzzle_identifiers", "puzzle_indices", "group_indices")
_SCAN_CHUNK_ROWS = 1 << 16  # bounded memory when range-checking memory-mapped token arrays


def _plain(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and not set("/\\\0") & set(name)


class PuzzleFormatError(ValueError):
    """A data set on disk does not match the upstream puzzle layout; names the file and field."""

    def __init__(self, path: str, field: str, message: str):
        self.path, self.field = path, field
        super().__init__(f"{path}: {field}: {message}")


@dataclasses.dataclass(frozen=True)
class PuzzleDatasetMetadata:
    """Contents of ``dataset.json`` (upstream field names, same meaning)."""

    pad_id: int
    ignore_label_id: int | None  # label value that is not supervised; -100 after loading
    blank_identifier_id: int  # puzzle id used for padding rows
    vocab_size: int
    seq_len: int
    num_puzzle_identifiers: int
    total_groups: int
    mean_puzzle_examples: float
    total_puzzles: int
    sets: list[str] = dataclasses.field(default_factory=lambda: ["all"])

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Any, path: str = "dataset.json") -> PuzzleDatasetMetadata:
        if not isinstance(obj, dict):
            raise PuzzleFormatError(
                path, "<root>", f"expected a JSON object, got {type(obj).__name__}"
            )
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in obj:
                raise PuzzleFormatError(path, f.name, "missing field")
            v = obj[f.name]
            if f.name == "sets":  # file name prefixes in the split's folder: plain names
                ok = isinstance(v, list) and v and all(_plain(s) for s in v)
                want = "a non-empty list of plain names (no '/', not '..')"
            elif f.name == "mean_puzzle_examples":
                ok = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                want = "a positive number"
            elif f.name == "ignore_label_id":
                ok = v is None or (isinstance(v, int) and not isinstance(v, bool))
                want = "an integer or null"
            else:
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
                want = "a non-negative integer"
            if not ok:
                raise PuzzleFormatError(path, f.name, f"expected {want}, got {v!r}")
            kwargs[f.name] = v
        meta = cls(**kwargs)
        for name in ("vocab_size", "seq_len", "num_puzzle_identifiers"):
            if getattr(meta, name) < 1:
                raise PuzzleFormatError(path, name, f"must be >= 1, got {getattr(meta, name)}")
        if meta.pad_id >= meta.vocab_size:
            raise PuzzleFormatError(
                path, "pad_id", f"{meta.pad_id} >= vocab_size {meta.vocab_size}"
            )
        if meta.blank_identifier_id >= meta.num_puzzle_identifiers:
            raise PuzzleFormatError(
                path,
                "blank_identifier_id",
                f"{meta.blank_identifier_id} >= num_puzzle_identifiers {meta.num_puzzle_identifiers}",
            )
        return meta


@dataclasses.dataclass
class PuzzleArrays:
    """The five arrays of one set of one split (see the module docstring for shapes)."""

    inputs: np.ndarray
    labels: np.ndarray
    puzzle_identifiers: np.ndarray
    puzzle_indices: np.ndarray
    group_indices: np.ndarray

    @property
    def num_examples(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def num_puzzles(self) -> int:
        return int(self.puzzle_identifiers.shape[0])

    @property
    def num_groups(self) -> int:
        return int(self.group_indices.shape[0]) - 1

    def validate(
        self,
        meta: PuzzleDatasetMetadata,
        where: str = "<memory>",
        *,
        labels_mapped: bool = False,
    ) -> None:
        """Raise PuzzleFormatError unless these arrays are a consistent data set under ``meta``.

        ``labels_mapped``: labels may contain IGNORE_LABEL (they were collated already).
        """

        def err(field, msg):
            raise PuzzleFormatError(where, field, msg)

        for name in FIELDS:
            a = getattr(self, name)
            if not isinstance(a, np.ndarray):
                err(name, f"expected a numpy array, got {type(a).__name__}")
            if not np.issubdtype(a.dtype, np.integer):
                err(name, f"expected an integer dtype, got {a.dtype}")
        for name in ("inputs", "labels"):
            a = getattr(self, name)
            if a.ndim != 2 or a.shape[1] != meta.seq_len:
                err(name, f"shape {a.shape}, expected [N_examples, seq_len={meta.seq_len}]")
        if self.labels.shape != self.inputs.shape:
            err("labels", f"shape {self.labels.shape} differs from inputs {self.inputs.shape}")
        for name in _INDEX_FIELDS:
            a = getattr(self, name)
            if a.ndim != 1:
                err(name, f"expected 1-D, got shape {a.shape}")
        n_ex, n_pz = self.num_examples, self.num_puzzles
        _check_csr(self.puzzle_indices, n_pz, n_ex, "puzzle_indices", "puzzles", "examples", err)
        _check_csr(self.group_indices, None, n_pz, "group_indices", "groups", "puzzles", err)
        if meta.total_groups != self.num_groups:
            err(
                "group_indices",
                f"{self.num_groups} groups but dataset.json total_groups = {meta.total_groups}",
            )
        # Upstream's Sudoku builder writes total_puzzles = number of groups although each group holds
        # 1 + num_aug puzzles; so only the bracket groups <= total_puzzles <= puzzles is checked.
        if not self.num_groups <= meta.total_puzzles <= n_pz:
            err(
                "puzzle_identifiers",
                f"{n_pz} puzzles in {self.num_groups} groups, but dataset.json total_puzzles = "
                f"{meta.total_puzzles}",
            )
        if n_pz and (
            self.puzzle_identifiers.min() < 0
            or self.puzzle_identifiers.max() >= meta.num_puzzle_identifiers
        ):
            err(
                "puzzle_identifiers",
                f"ids span [{self.puzzle_identifiers.min()}, {self.puzzle_identifiers.max()}], "
                f"expected [0, num_puzzle_identifiers={meta.num_puzzle_identifiers})",
            )
        _check_tokens(self.inputs, meta.vocab_size, (), "inputs", err)
        allowed = (IGNORE_LABEL,) if labels_mapped else ()
        if meta.ignore_label_id is not None:
            allowed += (meta.ignore_label_id,)
        _check_tokens(self.labels, meta.vocab_size, allowed, "labels", err)


def _check_csr(offsets, n_rows, n_items, field, rows, items, err):
    if offsets.shape[0] < 1:
        err(field, "empty; expected at least the leading 0")
    if n_rows is not None and offsets.shape[0] != n_rows + 1:
        err(field, f"length {offsets.shape[0]}, expected {rows} + 1 = {n_rows + 1}")
    if offsets[0] != 0:
        err(field, f"must start at 0, starts at {offsets[0]}")
    if offsets[-1] != n_items:
        err(field, f"must end at the number of {items} {n_items}, ends at {offsets[-1]}")
    step = np.diff(offsets.astype(np.int64))
    if (step <= 0).any():
        bad = int(np.argmax(step <= 0))
        err(
            field,
            f"not strictly increasing at {bad}: {offsets[bad]} -> {offsets[bad + 1]} (empty {rows[:-1]})",
        )


def _check_tokens(a, vocab_size, allowed_extra, field, err):
    for start in range(0, a.shape[0], _SCAN_CHUNK_ROWS):
        chunk = np.asarray(a[start : start + _SCAN_CHUNK_ROWS])
        bad = (chunk < 0) | (chunk >= vocab_size)
        for v in allowed_extra:
            bad &= chunk != v
        if bad.any():
            r, c = np.argwhere(bad)[0]
            err(
                field,
                f"token {chunk[r, c]} at [{start + r}, {c}] outside [0, vocab_size={vocab_size})",
            )


@dataclasses.dataclass
class PuzzleSplit:
    """One loaded split: its metadata and the arrays of each set (upstream: always "all")."""

    metadata: PuzzleDatasetMetadata
    sets: dict[str, PuzzleArrays]
    path: str = ""
    labels_mapped: bool = False  # labels already carry IGNORE_LABEL instead of ignore_label_id

    @property
    def all(self) -> PuzzleArrays:
        return self.sets["all"]


def make_metadata(
    arrays: PuzzleArrays,
    *,
    vocab_size: int,
    pad_id: int = 0,
    ignore_label_id: int | None = 0,
    blank_identifier_id: int = 0,
    num_puzzle_identifiers: int,
    total_puzzles: int | None = None,
    mean_puzzle_examples: float | None = None,
    sets: Sequence[str] = ("all",),
) -> PuzzleDatasetMetadata:
    """Metadata with seq_len and the counts derived from ``arrays`` (the defaults upstream uses
    except where a builder overrides ``total_puzzles``/``mean_puzzle_examples`` to match upstream)."""
    if mean_puzzle_examples is None:
        mean_puzzle_examples = arrays.num_examples / max(arrays.num_puzzles, 1)
    return PuzzleDatasetMetadata(
        pad_id=int(pad_id),
        ignore_label_id=None if ignore_label_id is None else int(ignore_label_id),
        blank_identifier_id=int(blank_identifier_id),
        vocab_size=int(vocab_size),
        seq_len=int(arrays.inputs.shape[1]),
        num_puzzle_identifiers=int(num_puzzle_identifiers),
        total_groups=arrays.num_groups,
        mean_puzzle_examples=float(mean_puzzle_examples),
        total_puzzles=int(arrays.num_puzzles if total_puzzles is None else total_puzzles),
        sets=list(sets),
    )


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint8) if vocab_size <= 256 else np.dtype(np.int32)


def check_output_dir(root: str | os.PathLike, overwrite: bool) -> None:
    """FileExistsError naming `root` unless a data set may be written there: `root` does not
    exist, or `overwrite` and it is an empty folder, or a folder holding only what a build wrote
    (the entries its built_by.json lists; without one, a data set of this layout and nothing
    else). Nothing else is ever replaced: not a file, not a user's file beside a data set, not a
    folder of other things (a mistyped output folder must not cost its contents). Builders call it
    before their work; write_dataset calls it again."""
    root = os.path.abspath(os.fspath(root))
    if not os.path.lexists(root):
        return
    if not overwrite:
        raise FileExistsError(f"{root} exists; pass overwrite=True (builders: --overwrite)")
    if not os.path.isdir(root):
        raise FileExistsError(f"{root} is a file, not a data set folder: not replaced")
    entries = set(os.listdir(root))
    if not entries:
        return
    rec = provenance.read(root)  # NotReplaced (a ValueError) when damaged
    if rec is not None:
        written, what = set(rec["files"]), f"its build wrote ({provenance.RECORD})"
    elif "identifiers.json" in entries or any(
        os.path.isfile(os.path.join(root, s, "dataset.json")) for s in SPLITS
    ):
        written, what = _LAYOUT_ENTRIES, "a data set of this layout has"
    else:
        raise FileExistsError(
            f"{root} holds {len(entries)} entries but no data set (no identifiers.json or "
            "<split>/dataset.json): not replaced; empty it or choose another folder"
        )
    foreign = sorted(entries - written)
    if foreign:
        raise FileExistsError(
            f"{root} holds {', '.join(foreign[:5])}, beyond what {what}: not replaced; move "
            "them out or choose another folder"
        )


# A data set folder's entries without a build record: what write_dataset writes (ARC: its extra)
_LAYOUT_ENTRIES = {"identifiers.json", *SPLITS, "test_puzzles.json"}


def write_dataset(
    root: str | os.PathLike,
    splits: Mapping[str, tuple[PuzzleDatasetMetadata, Mapping[str, PuzzleArrays]]],
    identifiers: Sequence[str],
    *,
    extra_json: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    built_by: dict | None = None,
) -> str:
    """Validate and write a whole data set atomically; returns the final path.

    ``splits``: e.g. ``{"train": (meta, {"all": arrays}), "test": (...)}``. Everything is written
    into a temporary sibling directory that is renamed onto ``root`` at the end, so an interrupted
    build never leaves a half-written data set behind. ``extra_json``: ``{"test_puzzles": obj}``
    writes ``<root>/test_puzzles.json``. ``built_by``: the builder command's record
    (data.provenance), written beside as built_by.json with the names of what was written.
    """
    root = os.path.abspath(os.fspath(root))
    check_output_dir(root, overwrite)
    for split, (meta, sets) in splits.items():
        if split not in SPLITS:
            raise ValueError(f"split {split!r} not in {SPLITS}")
        if sorted(sets) != sorted(meta.sets):
            raise ValueError(f"{split}: sets {sorted(sets)} != metadata sets {meta.sets}")
        for set_name, arrays in sets.items():
            arrays.validate(meta, f"{root}/{split}/{set_name}")
    if not identifiers or len(identifiers) < max(
        m.num_puzzle_identifiers for m, _ in splits.values()
    ):
        raise ValueError(
            f"identifiers has {len(identifiers)} names, fewer than num_puzzle_identifiers"
        )

    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.tmp-", dir=parent)
    try:
        for split, (meta, sets) in splits.items():
            os.makedirs(os.path.join(tmp, split))
            tok_dtype = _token_dtype(meta.vocab_size)
            for set_name, a in sets.items():
                for field in FIELDS:
                    arr = getattr(a, field)
                    arr = arr.astype(
                        tok_dtype if field in ("inputs", "labels") else np.int32, copy=False
                    )
                    np.save(os.path.join(tmp, split, f"{set_name}__{field}.npy"), arr)
            with open(os.path.join(tmp, split, "dataset.json"), "w") as f:
                json.dump(meta.to_json(), f)
        with open(os.path.join(tmp, "identifiers.json"), "w") as f:
            json.dump(list(identifiers), f)
        for name, obj in (extra_json or {}).items():
            with open(os.path.join(tmp, f"{name}.json"), "w") as f:
                json.dump(obj, f)
        if built_by is not None:
            provenance.write(tmp, built_by, os.listdir(tmp))
        if os.path.exists(root):  # overwrite: move the old copy aside first, delete it last
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.old-", dir=parent)
            os.rename(root, os.path.join(old, "d"))
            os.rename(tmp, root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def load_identifiers(root: str | os.PathLike) -> list[str]:
    path = os.path.join(os.fspath(root), "identifiers.json")
    if not os.path.isfile(path):
        raise PuzzleFormatError(path, "identifiers.json", "missing file")
    with open(path) as f:
        ids = json.load(f)
    if not isinstance(ids, list):
        raise PuzzleFormatError(path, "identifiers.json", "expected a JSON list of names")
    return ids


def load_metadata(root: str | os.PathLike, split: str) -> PuzzleDatasetMetadata:
    path = os.path.join(os.fspath(root), split, "dataset.json")
    if not os.path.isfile(path):
        raise PuzzleFormatError(path, "dataset.json", "missing file")
    try:
        with open(path) as f:
            obj = json.load(f)
    except json.JSONDecodeError as e:
        raise PuzzleFormatError(path, "dataset.json", f"not valid JSON ({e})") from e
    return PuzzleDatasetMetadata.from_json(obj, path)


def load_split(
    root: str | os.PathLike, split: str, *, mmap: bool = False, raw: bool = False
) -> PuzzleSplit:
    """Load and validate ``<root>/<split>``.

    Default: int32 arrays, labels equal to ``ignore_label_id`` replaced by -100 (upstream collate).
    ``raw=True``: arrays as stored. ``mmap=True``: inputs/labels memory-mapped as stored (raw).
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} not in {SPLITS}")
    root = os.fspath(root)
    meta = load_metadata(root, split)
    sets = {}
    for set_name in meta.sets:
        loaded = {}
        for field in FIELDS:
            path = os.path.join(root, split, f"{set_name}__{field}.npy")
            if not os.path.isfile(path):
                raise PuzzleFormatError(path, field, "missing file")
            mode = "r" if mmap and field in ("inputs", "labels") else None
            try:
                a = np.load(path, mmap_mode=mode, allow_pickle=False)
            except ValueError as e:
                raise PuzzleFormatError(path, field, f"not a plain numpy array ({e})") from e
            if not np.issubdtype(a.dtype, np.integer):
                raise PuzzleFormatError(path, field, f"expected an integer dtype, got {a.dtype}")
            if (
                field in _INDEX_FIELDS
                and a.dtype.itemsize > 4
                and a.size
                and a.max() > np.iinfo(np.int32).max
            ):
                raise PuzzleFormatError(path, field, "values do not fit int32")
            loaded[field] = a
        arrays = PuzzleArrays(**loaded)
        arrays.validate(meta, os.path.join(root, split, f"{set_name}__*.npy"))
        for field in _INDEX_FIELDS:
            setattr(arrays, field, getattr(arrays, field).astype(np.int32, copy=False))
        if not (raw or mmap):
            arrays.inputs, arrays.labels = collate(arrays.inputs, arrays.labels, meta)
        sets[set_name] = arrays
    return PuzzleSplit(meta, sets, path=os.path.join(root, split), labels_mapped=not (raw or mmap))


def collate(
    inputs: np.ndarray, labels: np.ndarray, meta: PuzzleDatasetMetadata
) -> tuple[np.ndarray, np.ndarray]:
    """int32 cast and ``labels == ignore_label_id -> -100``, as upstream does per batch.

    Idempotent: already-collated rows contain no ``ignore_label_id`` any more.
    """
    inputs = np.asarray(inputs).astype(np.int32, copy=False)
    labels = np.asarray(labels).astype(np.int32)
    if meta.ignore_label_id is not None:
        labels[labels == meta.ignore_label_id] = IGNORE_LABEL
    return inputs, labels
