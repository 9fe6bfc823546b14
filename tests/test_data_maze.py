"""Maze builder: CSV and upstream-layout sources, dihedral augmentation, solution validation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from data import maze
from data.augment import dihedral_transform, inverse_dihedral_transform
from data.puzzle_format import load_split


def generate_mazes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` solved 30x30 mazes as token rows (inputs, labels), uint8 [n, 900].

    A depth-first "recursive backtracker" carves a perfect maze (one route between any two cells)
    through the 14x14 rooms at odd coordinates; S and G go in two random rooms, and the label
    draws the one route between them in 'o' (found by breadth-first search). The rest of the maze
    stays open but off the route, as in Maze-Hard."""
    rng = np.random.default_rng(seed)
    rooms = (maze.GRID - 2) // 2  # rooms at 1, 3, ..., 27; rows/columns 28 and 29 stay wall
    inputs, labels = [], []
    for _ in range(n):
        x = np.full((maze.GRID, maze.GRID), maze.WALL, np.uint8)
        seen = np.zeros((rooms, rooms), bool)
        stack = [(int(rng.integers(rooms)), int(rng.integers(rooms)))]
        seen[stack[0]] = True
        x[2 * stack[0][0] + 1, 2 * stack[0][1] + 1] = maze.OPEN
        while stack:
            i, j = stack[-1]
            nexts = [
                (i + di, j + dj)
                for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1))
                if 0 <= i + di < rooms and 0 <= j + dj < rooms and not seen[i + di, j + dj]
            ]
            if not nexts:
                stack.pop()
                continue
            a, b = nexts[int(rng.integers(len(nexts)))]
            seen[a, b] = True
            x[i + a + 1, j + b + 1] = x[2 * a + 1, 2 * b + 1] = maze.OPEN  # the wall between, room
            stack.append((a, b))
        open_cells = np.argwhere(x == maze.OPEN)
        s, g = (tuple(open_cells[k]) for k in rng.choice(len(open_cells), 2, replace=False))
        x[s], x[g] = maze.START, maze.GOAL
        prev = {s: None}
        frontier = [s]
        while g not in prev:  # breadth-first search from S over the non-wall cells
            nxt = []
            for i, j in frontier:
                for c in ((i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1)):
                    if c not in prev and x[c] != maze.WALL:
                        prev[c] = (i, j)
                        nxt.append(c)
            frontier = nxt
        y = x.copy()
        c = prev[g]
        while c != s:
            y[c] = maze.PATH
            c = prev[c]
        inputs.append(x.reshape(-1))
        labels.append(y.reshape(-1))
    return np.stack(inputs), np.stack(labels)


@pytest.fixture(scope="module")
def fixture_dir(shared_data_dir):
    """The real Maze-Hard copy (upstream layout); only the byte-identity test reads it."""
    return os.path.join(shared_data_dir, "maze-30x30-hard-1k")


@pytest.fixture(scope="module")
def fixture_rows():
    """Six generated mazes: every test but the byte-identity one runs without ../shared/data."""
    return generate_mazes(6, seed=0)


def test_generated_mazes_are_valid_and_distinct(fixture_rows):
    x, y = fixture_rows
    maze.validate_mazes(x, y)
    assert len({r.tobytes() for r in x}) == len(x)
    for r in range(len(x)):  # a route of several cells, and open cells left off it
        assert (y[r] == maze.PATH).sum() >= 2 and (y[r] == maze.OPEN).sum() >= 50


def _chars(row) -> str:
    return "".join(maze.CHARSET[v - 1] for v in row)


def _write_csv(path, inputs, labels):
    with open(path, "w") as f:
        f.write("source,question,answer,rating\n")
        for x, y in zip(inputs, labels):
            f.write(f"fixture,{_chars(x)},{_chars(y)},7\n")


def test_upstream_fixture_rebuilds_identically(fixture_dir, tmp_path):
    s = maze.main(["--source", fixture_dir, "--out-dir", str(tmp_path / "m")])
    assert s["train_examples"] == 1000 and s["test_examples"] == 1000
    for split in ("train", "test"):
        ref, got = (
            load_split(fixture_dir, split, raw=True),
            load_split(tmp_path / "m", split, raw=True),
        )
        assert got.metadata == ref.metadata
        for field in ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices"):
            a, b = getattr(ref.all, field), getattr(got.all, field)
            assert a.dtype == b.dtype, field
            np.testing.assert_array_equal(a, b, err_msg=field)
    assert json.loads((tmp_path / "m" / "identifiers.json").read_text()) == ["<blank>"]
    loaded = load_split(tmp_path / "m", "test")  # training view: ignore label 0 -> -100
    assert loaded.all.labels.dtype == np.int32 and not (loaded.all.labels == 0).any()


def _csv_source(tmp_path, x, y):
    """A --source folder: the first 4 fixture mazes as train.csv, the rest as test.csv."""
    src = tmp_path / "csv"
    src.mkdir()
    _write_csv(src / "train.csv", x[:4], y[:4])
    _write_csv(src / "test.csv", x[4:], y[4:])
    return src


def test_csv_source_and_augmentation(fixture_rows, tmp_path):
    x, y = fixture_rows
    src = _csv_source(tmp_path, x, y)
    maze.build(tmp_path / "plain", source=src)
    train = load_split(tmp_path / "plain", "train", raw=True).all
    np.testing.assert_array_equal(train.inputs, x[:4])
    np.testing.assert_array_equal(
        load_split(tmp_path / "plain", "test", raw=True).all.labels, y[4:]
    )

    maze.build(tmp_path / "aug", source=src, aug=True)
    aug = load_split(tmp_path / "aug", "train", raw=True).all
    test = load_split(tmp_path / "aug", "test", raw=True).all
    assert aug.num_examples == 32 and test.num_examples == 2  # test is never augmented
    np.testing.assert_array_equal(aug.group_indices, np.arange(0, 33, 8))
    maze.validate_mazes(aug.inputs, aug.labels)  # every transform keeps a valid solved maze
    for g in range(4):
        for t in range(8):
            row = aug.inputs[g * 8 + t].reshape(30, 30)
            np.testing.assert_array_equal(inverse_dihedral_transform(row, t).reshape(-1), x[g])
    assert len({aug.inputs[t].tobytes() for t in range(8)}) == 8

    maze.build(tmp_path / "sub", source=src, subsample_size=2, seed=1)
    maze.build(tmp_path / "sub2", source=src, subsample_size=2, seed=1)
    a = load_split(tmp_path / "sub", "train", raw=True).all.inputs
    np.testing.assert_array_equal(a, load_split(tmp_path / "sub2", "train", raw=True).all.inputs)
    assert a.shape == (2, 900)
    with pytest.raises(FileExistsError):
        maze.build(tmp_path / "sub", source=src)


def test_download_path_through_a_file_url(fixture_rows, tmp_path, monkeypatch):
    x, y = fixture_rows
    repo = tmp_path / "hub" / "sapientinc" / "maze"
    repo.mkdir(parents=True)
    _write_csv(repo / "train.csv", x[:2], y[:2])
    _write_csv(repo / "test.csv", x[2:3], y[2:3])
    monkeypatch.setattr(maze, "HF_URL", f"file://{tmp_path}/hub/{{repo}}/{{filename}}")
    path = maze.download("train.csv", tmp_path / "cache", repo="sapientinc/maze")
    np.testing.assert_array_equal(maze.read_csv(path)[0], x[:2])
    with pytest.raises(RuntimeError, match="offline"):
        maze.download("missing.csv", tmp_path / "cache", repo="sapientinc/maze")
    assert not list((tmp_path / "cache").glob(".*tmp*"))


def _mutations():
    # (name, function(x, y) -> (x, y) on 30x30 grids, expected message fragment)
    def cut_path(x, y):
        path = np.argwhere(y == maze.PATH)
        y[tuple(path[len(path) // 2])] = maze.OPEN
        return x, y

    def stray_path(x, y):
        far = np.argwhere((x == maze.OPEN) & (y == maze.OPEN))
        for i, j in far:  # an open cell with no path/S/G neighbour
            nb = y[max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2]
            if not np.isin(nb, [maze.PATH, maze.START, maze.GOAL]).any():
                y[i, j] = maze.PATH
                return x, y
        raise AssertionError("no isolated open cell")

    def move_wall(x, y):
        i, j = np.argwhere(x == maze.WALL)[0]
        y[i, j] = maze.OPEN
        return x, y

    def two_starts(x, y):
        i, j = np.argwhere(x == maze.WALL)[0]
        x[i, j] = y[i, j] = maze.START
        return x, y

    def path_in_question(x, y):
        x[y == maze.PATH] = maze.PATH
        return x, y

    return [
        ("cut_path", cut_path, "do not connect S to G"),
        ("stray_path", stray_path, "not connected to the S-G path"),
        ("move_wall", move_wall, "only ' ' -> 'o'"),
        ("two_starts", two_starts, "2 'S' cells"),
        ("path_in_question", path_in_question, "already contains path"),
    ]


@pytest.mark.parametrize("name,mutate,message", _mutations(), ids=[m[0] for m in _mutations()])
def test_validation_rejects_broken_mazes(fixture_rows, name, mutate, message):
    x, y = (a[0].reshape(30, 30).copy() for a in fixture_rows)
    maze.validate_mazes(x.reshape(1, -1), y.reshape(1, -1))  # the original is valid
    x, y = mutate(x, y)
    with pytest.raises(maze.MazeError, match=message):
        maze.validate_mazes(x.reshape(1, -1), y.reshape(1, -1), where="t.csv")


def test_csv_errors_name_file_and_row(fixture_rows, tmp_path):
    x, y = fixture_rows
    bad = tmp_path / "train.csv"
    _write_csv(bad, x[:2], y[:2])
    lines = bad.read_text().splitlines()
    lines[2] = lines[2].replace("#", "X", 1)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(maze.MazeError, match=r"train.csv \(question\) row 1: character 'X'"):
        maze.read_csv(bad)
    bad.write_text("a,b\n")
    with pytest.raises(maze.MazeError, match="expected header"):
        maze.read_csv(bad)
    _write_csv(bad, x[:2], y[:2])
    (tmp_path / "test.csv").write_text("source,question,answer,rating\nz,ab,ab,0\n")
    with pytest.raises(maze.MazeError, match="2 characters, expected 900"):
        maze.build(tmp_path / "out", source=tmp_path)


def test_built_maze_through_the_grain_puzzle_sources(fixture_rows, tmp_path):
    from data.puzzle_source import PuzzleTestDataset, PuzzleTrainDataset

    x, y = fixture_rows
    src = _csv_source(tmp_path, x, y)
    maze.build(tmp_path / "aug", source=src, aug=True)
    # Test batches: storage order, labels with ignore 0 -> -100 (never happens: every cell is
    # labelled in Maze), padded last batch.
    batches = list(
        PuzzleTestDataset(
            tmp_path / "aug",
            split_name="test",
            global_batch_size=4,
            process_index=0,
            process_count=1,
        )
    )
    assert len(batches) == 1 and batches[0]["mask"].tolist() == [1, 1, 0, 0]
    np.testing.assert_array_equal(batches[0]["inputs"][:2], x[4:])
    np.testing.assert_array_equal(batches[0]["labels"][:2], y[4:])
    # Train batches: one random augmentation per group; each row is a valid maze and one of the
    # 8 transforms of one of the 4 train mazes.
    ds = PuzzleTrainDataset(
        tmp_path / "aug",
        split_name="train",
        global_batch_size=4,
        seed=0,
        process_index=0,
        process_count=1,
        num_iterations=2,
    )
    rows = list(ds)
    assert len(rows) == 2
    allowed = {
        np.ascontiguousarray(dihedral_transform(x[g].reshape(30, 30), t)).tobytes()
        for g in range(4)
        for t in range(8)
    }
    for b in rows:
        assert b["inputs"].shape == (4, 900)
        maze.validate_mazes(b["inputs"], b["labels"])
        assert {r.astype(np.uint8).tobytes() for r in b["inputs"]} <= allowed


def test_build_without_source_downloads_both_csvs(fixture_rows, tmp_path, monkeypatch):
    x, y = fixture_rows
    repo = tmp_path / "hub" / maze.HF_REPO
    repo.mkdir(parents=True)
    _write_csv(repo / "train.csv", x[:3], y[:3])
    _write_csv(repo / "test.csv", x[3:], y[3:])
    monkeypatch.setattr(maze, "HF_URL", f"file://{tmp_path}/hub/{{repo}}/{{filename}}")
    s = maze.build(tmp_path / "out", cache_dir=tmp_path / "cache")
    assert (s["train_mazes"], s["test_mazes"], s["source"]) == (3, 3, maze.HF_REPO)
    np.testing.assert_array_equal(load_split(tmp_path / "out", "test", raw=True).all.inputs, x[3:])
