"""data.puzzle_format: upstream files load unchanged, writer/loader round trip, every validation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from data.puzzle_format import (
    FIELDS,
    IGNORE_LABEL,
    PuzzleArrays,
    PuzzleFormatError,
    collate,
    load_identifiers,
    load_split,
    make_metadata,
    write_dataset,
)


def _upstream_dirs(shared_data_dir):
    return {
        "sudoku": (
            os.path.join(shared_data_dir, "sudoku", "sudoku-extreme-1k-train-only"),
            ["train"],
        ),
        "maze": (os.path.join(shared_data_dir, "maze-30x30-hard-1k"), ["train", "test"]),
    }


@pytest.mark.parametrize("name", ["sudoku", "maze"])
def test_upstream_offline_copies_load_unchanged(shared_data_dir, name):
    root, splits = _upstream_dirs(shared_data_dir)[name]
    assert load_identifiers(root) == ["<blank>"]
    for split in splits:
        with open(os.path.join(root, split, "dataset.json")) as f:
            meta_json = json.load(f)
        raw = load_split(root, split, raw=True)
        assert raw.metadata.to_json() == meta_json
        cooked = load_split(root, split)
        for field in FIELDS:
            on_disk = np.load(os.path.join(root, split, f"all__{field}.npy"))
            np.testing.assert_array_equal(getattr(raw.all, field), on_disk)
            assert getattr(cooked.all, field).dtype == np.int32
        np.testing.assert_array_equal(cooked.all.inputs, raw.all.inputs.astype(np.int32))
        # ignore_label_id (0) -> -100 exactly where the stored label is 0, nowhere else.
        stored = raw.all.labels.astype(np.int32)
        np.testing.assert_array_equal(
            cooked.all.labels, np.where(stored == 0, IGNORE_LABEL, stored)
        )


def _random_arrays(rng, n_groups=5, seq_len=7, vocab=9, ignore=0):
    """Groups of 1-3 puzzles, puzzles of 1-4 examples (ARC-like shape)."""
    puzzles_per_group = rng.integers(1, 4, n_groups)
    n_puzzles = int(puzzles_per_group.sum())
    examples_per_puzzle = rng.integers(1, 5, n_puzzles)
    n = int(examples_per_puzzle.sum())
    labels = rng.integers(1, vocab, (n, seq_len))
    labels[rng.random((n, seq_len)) < 0.3] = ignore
    return PuzzleArrays(
        inputs=rng.integers(0, vocab, (n, seq_len)),
        labels=labels,
        puzzle_identifiers=rng.integers(1, n_puzzles + 1, n_puzzles).astype(np.int32),
        puzzle_indices=np.concatenate([[0], np.cumsum(examples_per_puzzle)]).astype(np.int32),
        group_indices=np.concatenate([[0], np.cumsum(puzzles_per_group)]).astype(np.int32),
    )


def _write(tmp_path, arrays, *, vocab=9, n_ids=None, name="ds", **kw):
    n_ids = n_ids or int(arrays.puzzle_identifiers.max()) + 1
    meta = make_metadata(arrays, vocab_size=vocab, num_puzzle_identifiers=n_ids)
    ids = ["<blank>"] + [f"p{i}" for i in range(1, n_ids)]
    root = write_dataset(tmp_path / name, {"train": (meta, {"all": arrays})}, ids, **kw)
    return root, meta


def test_write_load_round_trip_dtypes_and_mapping(tmp_path):
    arrays = _random_arrays(np.random.default_rng(0))
    root, meta = _write(tmp_path, arrays, extra_json={"test_puzzles": {"a": [1, 2]}})
    assert sorted(os.listdir(root)) == ["identifiers.json", "test_puzzles.json", "train"]
    # On disk as upstream stores them: small tokens as uint8, index arrays int32.
    for field in FIELDS:
        stored = np.load(os.path.join(root, "train", f"all__{field}.npy"))
        assert stored.dtype == (np.uint8 if field in ("inputs", "labels") else np.int32), field
    raw = load_split(root, "train", raw=True)
    assert raw.metadata == meta
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(raw.all, field), getattr(arrays, field))
    cooked = load_split(root, "train")
    np.testing.assert_array_equal(
        cooked.all.labels, np.where(arrays.labels == 0, IGNORE_LABEL, arrays.labels)
    )
    mm = load_split(root, "train", mmap=True)
    assert isinstance(mm.all.inputs, np.memmap)
    inputs, labels = collate(mm.all.inputs[:], mm.all.labels[:], mm.metadata)
    np.testing.assert_array_equal(labels, cooked.all.labels)
    # collate on already collated rows changes nothing
    again = collate(inputs, labels, mm.metadata)
    np.testing.assert_array_equal(again[1], labels)


def test_metadata_counts_follow_arrays():
    arrays = _random_arrays(np.random.default_rng(1))
    meta = make_metadata(arrays, vocab_size=9, num_puzzle_identifiers=20)
    assert meta.total_groups == arrays.num_groups
    assert meta.total_puzzles == arrays.num_puzzles
    assert meta.mean_puzzle_examples == pytest.approx(arrays.num_examples / arrays.num_puzzles)
    assert meta.seq_len == 7 and meta.sets == ["all"]


def test_writer_is_atomic_and_refuses_to_clobber(tmp_path):
    arrays = _random_arrays(np.random.default_rng(2))
    root, _ = _write(tmp_path, arrays)
    with pytest.raises(FileExistsError):
        _write(tmp_path, arrays)
    # A bad build (token >= vocab) fails before anything replaces the good copy.
    bad = _random_arrays(np.random.default_rng(3))
    bad.inputs[0, 0] = 50
    with pytest.raises(PuzzleFormatError, match="inputs"):
        _write(tmp_path, bad, overwrite=True)
    np.testing.assert_array_equal(load_split(root, "train", raw=True).all.inputs, arrays.inputs)
    assert sorted(os.listdir(tmp_path)) == ["ds"], "no temporary directory left behind"
    # overwrite=True replaces it
    other = _random_arrays(np.random.default_rng(4))
    _write(tmp_path, other, overwrite=True)
    np.testing.assert_array_equal(load_split(root, "train", raw=True).all.inputs, other.inputs)
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def test_overwrite_replaces_only_an_empty_folder_or_a_data_set(tmp_path):
    """overwrite=True never costs what is not a data set: a file or a folder of other things at
    the output path is refused (FileExistsError naming it) and left as it was; an empty folder is
    written into."""
    arrays = _random_arrays(np.random.default_rng(5))
    (tmp_path / "file").write_text("mine")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("mine")
    for name, why in (("file", "is a file"), ("folder", "holds 1 entries but no data set")):
        with pytest.raises(FileExistsError, match=f"{tmp_path / name} {why}"):
            _write(tmp_path, arrays, name=name, overwrite=True)
    assert (tmp_path / "file").read_text() == (tmp_path / "folder" / "notes.txt").read_text()
    assert sorted(os.listdir(tmp_path)) == ["file", "folder"], "nothing else left behind"
    (tmp_path / "empty").mkdir()
    root, _ = _write(tmp_path, arrays, name="empty", overwrite=True)
    np.testing.assert_array_equal(load_split(root, "train", raw=True).all.inputs, arrays.inputs)


def _corrupt(root, field, value):
    np.save(os.path.join(root, "train", f"all__{field}.npy"), value)


def _edit_json(root, **changes):
    path = os.path.join(root, "train", "dataset.json")
    with open(path) as f:
        obj = json.load(f)
    obj.update(changes)
    for k, v in changes.items():
        if v is None:
            del obj[k]
    with open(path, "w") as f:
        json.dump(obj, f)


CASES = {
    "missing file": (
        lambda r, a: os.remove(os.path.join(r, "train", "all__labels.npy")),
        "labels",
        "missing file",
    ),
    "missing dataset.json": (
        lambda r, a: os.remove(os.path.join(r, "train", "dataset.json")),
        "dataset.json",
        "missing file",
    ),
    "missing metadata field": (
        lambda r, a: _edit_json(r, vocab_size=None),
        "vocab_size",
        "missing field",
    ),
    "wrong dtype": (
        lambda r, a: _corrupt(r, "inputs", a.inputs.astype(np.float32)),
        "inputs",
        "integer dtype",
    ),
    "seq_len mismatch": (lambda r, a: _edit_json(r, seq_len=8), "inputs", "seq_len=8"),
    "labels shape": (
        lambda r, a: _corrupt(r, "labels", a.labels[:-1]),
        "labels",
        "differs from inputs",
    ),
    "CSR not monotone": (
        lambda r, a: _corrupt(r, "puzzle_indices", _swap(a.puzzle_indices)),
        "puzzle_indices",
        "not strictly increasing",
    ),
    "CSR end mismatch": (
        lambda r, a: _corrupt(r, "group_indices", a.group_indices[:-1]),
        "group_indices",
        "must end at",
    ),
    "group count mismatch": (
        lambda r, a: _edit_json(r, total_groups=99),
        "group_indices",
        "total_groups = 99",
    ),
    "id out of range": (
        lambda r, a: _corrupt(r, "puzzle_identifiers", a.puzzle_identifiers + 100),
        "puzzle_identifiers",
        "num_puzzle_identifiers",
    ),
    "vocab overflow": (
        lambda r, a: _corrupt(r, "labels", np.where(a.labels == 3, 9, a.labels)),
        "labels",
        "vocab_size=9",
    ),
    "negative token": (
        lambda r, a: _corrupt(r, "inputs", a.inputs.astype(np.int64) - 1),
        "inputs",
        "outside",
    ),
}


def _swap(offsets):
    o = offsets.copy()
    o[1], o[2] = o[2], o[1]
    return o


@pytest.mark.parametrize("case", sorted(CASES))
def test_loader_rejects_bad_data_with_file_and_field(tmp_path, case):
    arrays = _random_arrays(np.random.default_rng(5))
    root, _ = _write(tmp_path, arrays)
    load_split(root, "train")  # valid before corruption
    corrupt, field, message = CASES[case]
    corrupt(root, arrays)
    with pytest.raises(PuzzleFormatError) as info:
        load_split(root, "train")
    assert info.value.field == field
    assert root in str(info.value) and message in str(info.value)
