"""data.puzzle_source: upstream group sampling, determinism, resume, per-process rows, eval padding."""

from __future__ import annotations

import json

import grain
import numpy as np
import pytest

from data.puzzle_format import IGNORE_LABEL, PuzzleArrays, load_split, make_metadata, write_dataset
from data.puzzle_source import PuzzleTestDataset, PuzzleTrainDataset


def _multi_example_set(tmp_path, *, n_groups=23, seq_len=5, vocab=7, seed=0):
    """Groups of 1-3 puzzles, puzzles of 1-6 examples (ARC-like): exercises truncation and
    drop-last. Puzzle p has identifier p + 1, so rows can be traced back to their puzzle."""
    rng = np.random.default_rng(seed)
    ppg = rng.integers(1, 4, n_groups)
    n_puzzles = int(ppg.sum())
    epp = rng.integers(1, 7, n_puzzles)
    n = int(epp.sum())
    arrays = PuzzleArrays(
        inputs=rng.integers(0, vocab, (n, seq_len)),
        labels=rng.integers(0, vocab, (n, seq_len)),
        puzzle_identifiers=np.arange(1, n_puzzles + 1, dtype=np.int32),
        puzzle_indices=np.concatenate([[0], np.cumsum(epp)]).astype(np.int32),
        group_indices=np.concatenate([[0], np.cumsum(ppg)]).astype(np.int32),
    )
    meta = make_metadata(arrays, vocab_size=vocab, num_puzzle_identifiers=n_puzzles + 1)
    ids = ["<blank>"] + [f"p{i}" for i in range(n_puzzles)]
    root = write_dataset(
        tmp_path / "multi", {"train": (meta, {"all": arrays}), "test": (meta, {"all": arrays})}, ids
    )
    return root, arrays


def _reference_fill(puzzles, puzzle_indices, batch_size):
    """Upstream's batch filling written the obvious way: walk the drawn puzzles, add each one's
    examples until the batch is full (the overflowing puzzle is cut), drop the last partial batch."""
    batches, current = [], []
    for p in puzzles:
        size = int(puzzle_indices[p + 1] - puzzle_indices[p])
        current += [int(p)] * min(size, batch_size - len(current))
        if len(current) == batch_size:
            batches.append(current)
            current = []
    return batches


def test_train_sampling_matches_upstream_algorithm(tmp_path):
    root, arrays = _multi_example_set(tmp_path)
    ds = PuzzleTrainDataset(
        root, global_batch_size=16, seed=3, epochs_per_iter=2, process_index=0, process_count=1
    )
    puzzles, _ = ds.plan(0)
    # one puzzle per drawn group, each group drawn epochs_per_iter times, puzzle inside its group
    group_of_puzzle = np.repeat(np.arange(arrays.num_groups), np.diff(arrays.group_indices))
    np.testing.assert_array_equal(
        np.bincount(group_of_puzzle[puzzles], minlength=arrays.num_groups), 2
    )
    ref = _reference_fill(puzzles, arrays.puzzle_indices, 16)
    assert ds.num_batches(0) == len(ref) > 3
    for b, ref_batch in enumerate(ref):
        examples, pz = ds.global_example_indices(0, b)
        np.testing.assert_array_equal(pz, ref_batch)
        assert len(set(examples.tolist())) == 16, "an example appears twice in one batch"
        assert (
            (examples >= arrays.puzzle_indices[pz]) & (examples < arrays.puzzle_indices[pz + 1])
        ).all()
    # The batch dict carries those rows, cast to int32, ignore label (0) -> -100.
    it = iter(ds)
    batch = next(it)
    examples, pz = ds.global_example_indices(0, 0)
    assert {k: v.dtype for k, v in batch.items()} == {
        k: np.int32 for k in ("inputs", "labels", "puzzle_identifiers")
    }
    np.testing.assert_array_equal(batch["inputs"], arrays.inputs[examples])
    np.testing.assert_array_equal(
        batch["labels"],
        np.where(arrays.labels[examples] == 0, IGNORE_LABEL, arrays.labels[examples]),
    )
    np.testing.assert_array_equal(batch["puzzle_identifiers"], arrays.puzzle_identifiers[pz])


def test_train_examples_within_puzzle_are_shuffled(tmp_path):
    root, arrays = _multi_example_set(tmp_path)
    ds = PuzzleTrainDataset(
        root, global_batch_size=16, seed=0, epochs_per_iter=4, process_index=0, process_count=1
    )
    in_order = []
    for b in range(ds.num_batches(0)):
        examples, pz = ds.global_example_indices(0, b)
        for p in np.unique(pz):
            e = examples[pz == p]
            if len(e) > 2:
                in_order.append(bool((np.diff(e) > 0).all()))
    assert len(in_order) > 10 and not all(in_order)


def test_train_is_seeded_and_epochs_differ(tmp_path):
    root, _ = _multi_example_set(tmp_path)

    def first(seed, n=6):
        it = iter(
            PuzzleTrainDataset(
                root, global_batch_size=8, seed=seed, process_index=0, process_count=1
            )
        )
        return [next(it)["puzzle_identifiers"] for _ in range(n)]

    a, b, c = first(1), first(1), first(2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    ds = PuzzleTrainDataset(root, global_batch_size=8, seed=1, process_index=0, process_count=1)
    assert not np.array_equal(ds.plan(0)[0], ds.plan(1)[0])


def test_one_example_per_puzzle_epoch_visits_every_group_once(tmp_path):
    # Sudoku-shaped: each puzzle one example, groups of augmentations.
    rng = np.random.default_rng(0)
    g, aug, B = 40, 3, 8
    n = g * (1 + aug)
    arrays = PuzzleArrays(
        inputs=rng.integers(0, 11, (n, 81)),
        labels=rng.integers(1, 11, (n, 81)),
        puzzle_identifiers=np.zeros(n, np.int32),
        puzzle_indices=np.arange(n + 1, dtype=np.int32),
        group_indices=np.arange(0, n + 1, 1 + aug, dtype=np.int32),
    )
    meta = make_metadata(arrays, vocab_size=11, num_puzzle_identifiers=1, total_puzzles=g)
    root = write_dataset(tmp_path / "s", {"train": (meta, {"all": arrays})}, ["<blank>"])
    ds = PuzzleTrainDataset(root, global_batch_size=B, seed=0, process_index=0, process_count=1)
    assert ds.num_batches(0) == g // B
    seen = np.concatenate([ds.global_example_indices(0, b)[0] for b in range(g // B)])
    np.testing.assert_array_equal(np.sort(seen // (1 + aug)), np.arange(g))  # each group once
    assert len(np.unique(seen % (1 + aug))) > 1  # and not always the original


def _take(it, n):
    return [next(it) for _ in range(n)]


def _same(xs, ys):
    return len(xs) == len(ys) and all(
        all(np.array_equal(x[k], y[k]) for k in x) and x.keys() == y.keys() for x, y in zip(xs, ys)
    )


def test_resume_mid_epoch_and_across_iterations(tmp_path):
    root, _ = _multi_example_set(tmp_path)
    ds = PuzzleTrainDataset(root, global_batch_size=16, seed=7, process_index=0, process_count=1)
    n0 = ds.num_batches(0)
    it = iter(ds)
    _take(it, 2)
    state = json.loads(json.dumps(it.get_state()))  # what a checkpoint stores
    assert state["iteration"] == 0 and state["batch"] == 2
    expected = _take(it, 2 * n0 + 3)  # crosses two iteration boundaries
    resumed = iter(
        PuzzleTrainDataset(root, global_batch_size=16, seed=7, process_index=0, process_count=1)
    )
    resumed.set_state(state)
    assert _same(_take(resumed, 2 * n0 + 3), expected)


def test_state_at_an_iteration_end_marks_it_and_resumes_into_the_next(tmp_path):
    # The trainer evaluates when state["batch"] == num_batches(state["iteration"]): the move to the
    # next iteration must happen lazily, on the following next().
    root, _ = _multi_example_set(tmp_path)
    ds = PuzzleTrainDataset(root, global_batch_size=16, seed=2, process_index=0, process_count=1)
    it = iter(ds)
    _take(it, ds.num_batches(0))
    state = it.get_state()
    assert (state["iteration"], state["batch"]) == (0, ds.num_batches(0))
    first_of_next = next(it)
    assert (it.get_state()["iteration"], it.get_state()["batch"]) == (1, 1)
    assert _same([first_of_next], [ds.make_batch(1, 0)])
    resumed = iter(ds)
    resumed.set_state(state)
    assert _same([next(resumed)], [first_of_next])


def test_resume_through_grain_checkpoint_handler(tmp_path):
    from etils import epath

    root, _ = _multi_example_set(tmp_path)
    ds = PuzzleTrainDataset(root, global_batch_size=16, seed=7, process_index=0, process_count=1)
    it = iter(ds)
    _take(it, 3)
    ckpt = epath.Path(tmp_path / "ckpt")
    ckpt.mkdir()
    grain.checkpoint.CheckpointHandler().save(ckpt, item=it)
    expected = _take(it, 4)
    restored = grain.checkpoint.CheckpointHandler().restore(ckpt, item=iter(ds))
    assert _same(_take(restored, 4), expected)


def test_resume_through_map_and_thread_prefetch(tmp_path):
    # What a trainer stacks on top: a per-batch map and a background prefetch thread.
    root, _ = _multi_example_set(tmp_path)
    ds = PuzzleTrainDataset(root, global_batch_size=16, seed=7, process_index=0, process_count=1)
    pipeline = grain.experimental.ThreadPrefetchIterDataset(
        ds.map(lambda b: {**b, "n_supervised": np.int32((b["labels"] != IGNORE_LABEL).sum())}),
        prefetch_buffer_size=3,
    )
    it = iter(pipeline)
    _take(it, 4)
    state = it.get_state()
    expected = _take(it, 5)
    it.close()
    again = iter(pipeline)
    again.set_state(state)
    got = _take(again, 5)
    again.close()
    assert _same(got, expected)
    plain = _take(iter(ds), 9)[4:]  # the prefetch thread neither skips nor repeats a batch
    assert _same([{k: v for k, v in b.items() if k != "n_supervised"} for b in expected], plain)


def test_state_from_another_pipeline_is_refused(tmp_path):
    root, _ = _multi_example_set(tmp_path)
    state = iter(
        PuzzleTrainDataset(root, global_batch_size=16, seed=7, process_index=0, process_count=1)
    ).get_state()
    other = iter(
        PuzzleTrainDataset(root, global_batch_size=16, seed=8, process_index=0, process_count=1)
    )
    with pytest.raises(ValueError, match="seed=7"):
        other.set_state(state)


@pytest.mark.parametrize("count", [2, 4])
def test_train_process_shards_partition_the_global_batch(tmp_path, count):
    root, _ = _multi_example_set(tmp_path)
    whole = _take(
        iter(
            PuzzleTrainDataset(root, global_batch_size=16, seed=5, process_index=0, process_count=1)
        ),
        5,
    )
    shards = [
        _take(
            iter(
                PuzzleTrainDataset(
                    root, global_batch_size=16, seed=5, process_index=p, process_count=count
                )
            ),
            5,
        )
        for p in range(count)
    ]
    for step in range(5):
        for key in whole[step]:
            parts = [s[step][key] for s in shards]
            assert all(len(p) == 16 // count for p in parts)
            np.testing.assert_array_equal(np.concatenate(parts), whole[step][key])


def test_num_iterations_stops_and_bad_arguments(tmp_path):
    root, _ = _multi_example_set(tmp_path)
    ds = PuzzleTrainDataset(
        root, global_batch_size=16, seed=0, num_iterations=2, process_index=0, process_count=1
    )
    assert len(list(ds)) == ds.num_batches(0) + ds.num_batches(1)
    with pytest.raises(ValueError, match="not divisible"):
        PuzzleTrainDataset(root, global_batch_size=10, seed=0, process_index=0, process_count=4)
    with pytest.raises(ValueError, match="no full batch"):
        next(
            iter(
                PuzzleTrainDataset(
                    root, global_batch_size=10_000, seed=0, process_index=0, process_count=1
                )
            )
        )
    # defaults come from JAX (one process here)
    assert PuzzleTrainDataset(root, global_batch_size=16, seed=0).local_batch_size == 16


@pytest.mark.parametrize("count", [1, 2, 4])
def test_test_batches_cover_every_example_once_with_padding(tmp_path, count):
    root, arrays = _multi_example_set(tmp_path)
    split = load_split(root, "test")
    n, B = arrays.num_examples, 16
    assert n % B, "the fixture must leave a partial last window"
    example_pid = np.repeat(arrays.puzzle_identifiers, np.diff(arrays.puzzle_indices))
    per_process = [
        list(PuzzleTestDataset(split, global_batch_size=B, process_index=p, process_count=count))
        for p in range(count)
    ]
    assert all(len(b) == -(-n // B) for b in per_process)
    rows = {k: [] for k in ("inputs", "labels", "puzzle_identifiers", "mask")}
    for step in range(len(per_process[0])):
        for p in range(count):
            for k in rows:
                rows[k].append(per_process[p][step][k])
    got = {k: np.concatenate(v) for k, v in rows.items()}
    real = got["mask"] == 1
    assert real.sum() == n and (real[:n]).all() and not real[n:].any()
    np.testing.assert_array_equal(got["inputs"][:n], arrays.inputs)
    np.testing.assert_array_equal(got["labels"][:n], split.all.labels)
    np.testing.assert_array_equal(got["puzzle_identifiers"][:n], example_pid)
    # padding rows: pad inputs, ignored labels, blank puzzle id
    assert (got["inputs"][n:] == split.metadata.pad_id).all()
    assert (got["labels"][n:] == IGNORE_LABEL).all()
    assert (got["puzzle_identifiers"][n:] == split.metadata.blank_identifier_id).all()


def test_test_iterator_resumes(tmp_path):
    root, _ = _multi_example_set(tmp_path)
    ds = PuzzleTestDataset(root, global_batch_size=8, process_index=0, process_count=1)
    it = iter(ds)
    _take(it, 3)
    state = it.get_state()
    expected = _take(it, 4)
    again = iter(ds)
    again.set_state(state)
    assert _same(_take(again, 4), expected)
    assert _same([ds[3]], expected[:1])
