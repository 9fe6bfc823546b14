"""Grain sources for puzzle data sets in the upstream layout (see ``data.puzzle_format``).

API
---
``PuzzleTrainDataset(split, *, global_batch_size, seed, epochs_per_iter=1, num_iterations=None,
process_index=None, process_count=None, set_name="all")`` -- a ``grain.IterDataset``.
  Upstream's group-wise sampling, seeded: iteration ``k`` concatenates ``epochs_per_iter``
  permutations of the groups (drawn from ``default_rng((seed, k))``); for each group it picks one
  random puzzle (i.e. one augmentation) and adds that puzzle's examples in random order until the
  global batch is full; the puzzle that overflows a batch is truncated, and the incomplete last
  batch of an iteration is dropped. ``num_iterations=None`` repeats forever.
  ``iter(ds)`` gives a ``grain.DatasetIterator`` whose ``get_state()`` is the JSON dict
  ``{"iteration": k, "batch": b, ...}`` (the next global batch); ``set_state`` resumes exactly
  there, so ``grain.checkpoint.CheckpointSave/CheckpointRestore`` work with Orbax. After the last
  batch of iteration ``k`` the state reads ``{"iteration": k, "batch": num_batches(k)}`` (the
  trainer evaluates there, ``at_iteration_end()``); the step to ``k + 1`` happens on the next
  ``next()``.

``PuzzleTestDataset(split, *, global_batch_size, process_index=None, process_count=None,
set_name="all")`` -- a ``grain.MapDataset`` of ``ceil(N / global_batch_size)`` batches.
  Examples in storage order in global-batch windows. The last window is padded to full size with
  ``pad_id`` inputs, ``IGNORE_LABEL`` (-100) labels and ``blank_identifier_id`` puzzle ids; its
  ``mask`` is 0 on those rows. ``iter(ds)`` or ``ds.to_iter_dataset()`` iterates it resumably.

Both yield dicts of numpy int32 arrays for THIS process only (the global batch's rows
``[p * local, (p + 1) * local)``, ``local = global_batch_size // process_count``)::

    inputs [local, seq_len], labels [local, seq_len] (-100 = not supervised),
    puzzle_identifiers [local], and for test batches mask [local] (1 = real example, 0 = padding)

``process_index``/``process_count`` default to ``jax.process_index()``/``jax.process_count()``.
Every process draws the same global plan from the seed, so the shards are disjoint and cover each
global batch; feed them to ``jax.make_array_from_process_local_data``. ``split`` is a loaded
``PuzzleSplit`` or a data set directory plus ``split_name`` (then the token arrays are memory-mapped
like upstream, and cast/mapped per batch by ``puzzle_format.collate``).

Difference from upstream, on purpose: upstream mixes a Philox generator seeded ``seed + k`` with the
unseeded global ``np.random`` (example order), so two runs never see the same batches; here every
draw comes from ``seed`` and the position, so runs, resumes and processes agree.
"""

from __future__ import annotations

import math
import os
from typing import Any

import grain
import numpy as np

from data.process_rows import process_rows
from data.puzzle_format import IGNORE_LABEL, PuzzleArrays, PuzzleSplit, collate, load_split

_STATE_VERSION = 1
EVAL_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)


def _resolve_split(split: PuzzleSplit | str | os.PathLike, split_name: str | None) -> PuzzleSplit:
    if isinstance(split, PuzzleSplit):
        return split
    if split_name is None:
        raise ValueError("pass split_name ('train' or 'test') together with a data set directory")
    return load_split(split, split_name, mmap=True)


def _open(dataset, split, split_name, set_name, global_batch_size, process_index, process_count):
    """What both sources set up: the split's arrays and metadata, and this process's rows."""
    dataset.split = _resolve_split(split, split_name)
    dataset.arrays = dataset.split.sets[set_name]
    dataset.metadata = dataset.split.metadata
    dataset.global_batch_size = int(global_batch_size)
    start, stop = process_rows(global_batch_size, process_index, process_count)
    dataset.row_start, dataset.local_batch_size = start, stop - start


def _example_puzzles(arrays: PuzzleArrays) -> np.ndarray:
    """Puzzle index of every example, from the CSR offsets."""
    sizes = np.diff(arrays.puzzle_indices)
    return np.repeat(np.arange(arrays.num_puzzles, dtype=np.int32), sizes)


class PuzzleTrainDataset(grain.IterDataset):
    """Infinite (or ``num_iterations``-long) group-sampled training batches; see module docstring."""

    def __init__(
        self,
        split: PuzzleSplit | str | os.PathLike,
        *,
        global_batch_size: int,
        seed: int,
        epochs_per_iter: int = 1,
        num_iterations: int | None = None,
        process_index: int | None = None,
        process_count: int | None = None,
        set_name: str = "all",
        split_name: str | None = "train",
    ):
        super().__init__()
        if global_batch_size < 1 or epochs_per_iter < 1:
            raise ValueError("global_batch_size and epochs_per_iter must be >= 1")
        _open(self, split, split_name, set_name, global_batch_size, process_index, process_count)
        self.seed = int(seed)
        self.epochs_per_iter = int(epochs_per_iter)
        self.num_iterations = num_iterations
        sizes = np.diff(self.arrays.puzzle_indices)
        self._one_example_per_puzzle = bool((sizes == 1).all())
        self._plan_cache: tuple[int, np.ndarray, np.ndarray] | None = None

    def plan(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """(puzzles [n], batch_starts [n_batches + 1]) for one iteration; process-independent.

        Batch ``b`` takes puzzles ``puzzles[batch_starts[b]:batch_starts[b + 1]]``, the last one
        truncated so that the batch holds exactly ``global_batch_size`` examples.
        """
        if self._plan_cache is not None and self._plan_cache[0] == iteration:
            return self._plan_cache[1], self._plan_cache[2]
        a, B = self.arrays, self.global_batch_size
        rng = np.random.default_rng((self.seed, iteration))
        groups = np.broadcast_to(np.arange(a.num_groups), (self.epochs_per_iter, a.num_groups))
        order = rng.permuted(groups, axis=1).ravel()
        # One random puzzle (augmentation) of each drawn group.
        puzzles = rng.integers(a.group_indices[order], a.group_indices[order + 1]).astype(np.int32)
        if self._one_example_per_puzzle:
            n_batches = len(puzzles) // B
            starts = np.arange(n_batches + 1, dtype=np.int64) * B
        else:
            sizes = a.puzzle_indices[puzzles + 1] - a.puzzle_indices[puzzles]
            cum = np.cumsum(sizes, dtype=np.int64)
            starts, j = [0], 0
            while True:
                base = cum[j - 1] if j else 0
                end = int(np.searchsorted(cum, base + B, side="left"))  # first puzzle reaching B
                if end == len(puzzles):
                    break  # incomplete last batch: dropped, as upstream does
                j = end + 1
                starts.append(j)
            starts = np.asarray(starts, dtype=np.int64)
        self._plan_cache = (iteration, puzzles, starts)
        return puzzles, starts

    def global_example_indices(self, iteration: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """(example index [B], puzzle index [B]) of one global batch, identical on every process."""
        puzzles, starts = self.plan(iteration)
        chosen = puzzles[starts[batch] : starts[batch + 1]]
        a, B = self.arrays, self.global_batch_size
        first = a.puzzle_indices[chosen].astype(np.int64)
        if self._one_example_per_puzzle:
            return first, chosen.astype(np.int64)
        sizes = a.puzzle_indices[chosen + 1] - first
        # Random order of each puzzle's examples: sort random keys within each puzzle's segment.
        rng = np.random.default_rng((self.seed, iteration, batch))
        seg = np.repeat(np.arange(len(chosen)), sizes)
        offset_in_seg = np.arange(len(seg)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        perm = np.lexsort((rng.random(len(seg)), seg))  # segment-major, random within segment
        shuffled = offset_in_seg[perm]
        examples = np.repeat(first, sizes) + shuffled
        pz = np.repeat(chosen, sizes)
        return examples[:B].astype(np.int64), pz[:B].astype(np.int64)

    def num_batches(self, iteration: int) -> int:
        return len(self.plan(iteration)[1]) - 1

    def make_batch(self, iteration: int, batch: int) -> dict[str, np.ndarray]:
        examples, pz = self.global_example_indices(iteration, batch)
        sl = slice(self.row_start, self.row_start + self.local_batch_size)
        examples, pz = examples[sl], pz[sl]
        inputs, labels = collate(
            self.arrays.inputs[examples], self.arrays.labels[examples], self.metadata
        )
        return {
            "inputs": inputs,
            "labels": labels,
            "puzzle_identifiers": self.arrays.puzzle_identifiers[pz].astype(np.int32),
        }

    def __iter__(self) -> _PuzzleTrainIterator:
        return _PuzzleTrainIterator(self)

    def __str__(self) -> str:
        return (
            f"PuzzleTrainDataset({self.split.path!r}, global_batch_size={self.global_batch_size}, "
            f"seed={self.seed}, epochs_per_iter={self.epochs_per_iter})"
        )


class _PuzzleTrainIterator(grain.DatasetIterator):
    def __init__(self, ds: PuzzleTrainDataset):
        super().__init__()
        self._ds = ds
        self._iteration = 0
        self._batch = 0

    def __next__(self) -> dict[str, np.ndarray]:
        ds = self._ds
        while True:
            if ds.num_iterations is not None and self._iteration >= ds.num_iterations:
                raise StopIteration
            n_batches = ds.num_batches(self._iteration)
            if n_batches == 0:
                raise ValueError(
                    f"{ds}: iteration {self._iteration} holds no full batch of "
                    f"{ds.global_batch_size} examples; lower global_batch_size or raise epochs_per_iter"
                )
            if self._batch < n_batches:
                break
            self._iteration, self._batch = self._iteration + 1, 0
        out = ds.make_batch(self._iteration, self._batch)
        self._batch += 1
        return out

    def at_iteration_end(self) -> bool:
        """True when the batch just returned was the last of its iteration (upstream evaluates
        there): the move to the next iteration happens only on the next `next()`."""
        return self._batch >= self._ds.num_batches(self._iteration)

    def get_state(self) -> dict[str, Any]:
        ds = self._ds
        return {
            "version": _STATE_VERSION,
            "iteration": self._iteration,
            "batch": self._batch,
            # Restoring into a different pipeline would silently change the data order: check it.
            "seed": ds.seed,
            "global_batch_size": ds.global_batch_size,
            "epochs_per_iter": ds.epochs_per_iter,
            "total_groups": ds.arrays.num_groups,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        mine = self.get_state()
        for key in ("version", "seed", "global_batch_size", "epochs_per_iter", "total_groups"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"iterator state has {key}={state.get(key)!r} but this pipeline has "
                    f"{mine[key]!r}; the state belongs to another data pipeline"
                )
        self._iteration, self._batch = int(state["iteration"]), int(state["batch"])

    def __str__(self) -> str:
        return f"_PuzzleTrainIterator({self._ds})"


class PuzzleTestDataset(grain.MapDataset):
    """Sequential evaluation batches, last one padded; see module docstring."""

    def __init__(
        self,
        split: PuzzleSplit | str | os.PathLike,
        *,
        global_batch_size: int,
        process_index: int | None = None,
        process_count: int | None = None,
        set_name: str = "all",
        split_name: str | None = "test",
    ):
        super().__init__()
        _open(self, split, split_name, set_name, global_batch_size, process_index, process_count)
        self._example_puzzle = _example_puzzles(self.arrays)

    def __len__(self) -> int:
        return math.ceil(self.arrays.num_examples / self.global_batch_size)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"batch {index} out of range for {len(self)} batches")
        index %= len(self)
        lo = index * self.global_batch_size + self.row_start
        hi = min(lo + self.local_batch_size, self.arrays.num_examples)
        n = max(hi - lo, 0)
        meta, L = self.metadata, self.metadata.seq_len
        inputs = np.full((self.local_batch_size, L), meta.pad_id, np.int32)
        labels = np.full((self.local_batch_size, L), IGNORE_LABEL, np.int32)
        pids = np.full((self.local_batch_size,), meta.blank_identifier_id, np.int32)
        mask = np.zeros((self.local_batch_size,), np.int32)
        if n:
            inputs[:n], labels[:n] = collate(
                self.arrays.inputs[lo:hi], self.arrays.labels[lo:hi], meta
            )
            pids[:n] = self.arrays.puzzle_identifiers[self._example_puzzle[lo:hi]]
            mask[:n] = 1
        return {"inputs": inputs, "labels": labels, "puzzle_identifiers": pids, "mask": mask}

    def __iter__(self):
        # Grain's default read options prefetch 500 elements on 16 threads; one element here is a
        # whole batch (ARC: ~5 MB), so keep a few batches ahead instead of gigabytes.
        return self.to_iter_dataset(EVAL_READ_OPTIONS).__iter__()

    def __str__(self) -> str:
        return f"PuzzleTestDataset({self.split.path!r}, global_batch_size={self.global_batch_size})"
