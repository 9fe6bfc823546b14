"""Maze-Hard (30x30) in the upstream TRM/HRM puzzle layout.

    python -m data.maze --out-dir data_out/maze-30x30-hard-1k                 # download (online)
    python -m data.maze --source path/with/train.csv+test.csv --out-dir ...   # local CSVs
    python -m data.maze --source path/to/upstream-built-dataset --out-dir ... [--aug]

Source CSVs (Hugging Face `sapientinc/maze-30x30-hard-1k`): header, then rows
source,question,answer,rating; question/answer are 900 characters of the charset "# SGo"
(wall, open, start, goal, path). Tokens: PAD 0, '#' 1, ' ' 2, 'S' 3, 'G' 4, 'o' 5; vocab 6,
ignore_label_id 0, one puzzle identifier (0, "<blank>"). Each maze is its own puzzle and group;
`--aug` adds the 7 other dihedral transforms to each TRAIN maze's group (upstream's flag; it is
OFF by default even though upstream's README comment speaks of 8x augmentation). Test is never
augmented.

Every maze is checked before writing: the label equals the input except open cells turned into
path cells, there is one S and one G, and the path cells form one 4-connected chain joining S to
G. A bad row raises MazeError naming the source, row and reason.

API
  CHARSET, encode_grids(strings, where) -> uint8 [N, 900]
  validate_mazes(inputs, labels, where)        raises MazeError
  read_csv(path) -> (inputs, labels)
  build(out_dir, *, source=None, aug=False, subsample_size=None, seed=0, overwrite=False) -> dict
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import numpy as np
from scipy import ndimage
from tqdm import tqdm

from data import cli, provenance
from data.augment import dihedral_transform
from data.download import fetch
from data.puzzle_format import (
    PuzzleArrays,
    check_output_dir,
    load_split,
    make_metadata,
    write_dataset,
)

CHARSET = "# SGo"  # token id = 1 + index; 0 is PAD
GRID = 30
SEQ_LEN = GRID * GRID
VOCAB_SIZE = len(CHARSET) + 1
WALL, OPEN, START, GOAL, PATH = 1, 2, 3, 4, 5
HF_REPO = "sapientinc/maze-30x30-hard-1k"
HF_URL = "https://huggingface.co/datasets/{repo}/resolve/main/{filename}"

_LUT = np.zeros(256, dtype=np.uint8)
for _i, _c in enumerate(CHARSET):
    _LUT[ord(_c)] = _i + 1


class MazeError(ValueError):
    """A maze row that is not a valid solved maze; the message names where and why."""


def encode_grids(strings, where: str = "<memory>") -> np.ndarray:
    out = np.zeros((len(strings), SEQ_LEN), dtype=np.uint8)
    for r, s in enumerate(strings):
        if len(s) != SEQ_LEN:
            raise MazeError(f"{where} row {r}: {len(s)} characters, expected {SEQ_LEN} (30x30)")
        ids = _LUT[np.frombuffer(s.encode("latin-1", errors="replace"), dtype=np.uint8)]
        if (ids == 0).any():
            bad = s[int(np.argmax(ids == 0))]
            raise MazeError(f"{where} row {r}: character {bad!r} not in charset {CHARSET!r}")
        out[r] = ids
    return out


def validate_mazes(inputs: np.ndarray, labels: np.ndarray, where: str = "<memory>") -> None:
    """Raise MazeError unless each label is its input with one S-to-G path of 'o' cells drawn in."""
    for r in range(inputs.shape[0]):
        problem = _maze_problem(inputs[r].reshape(GRID, GRID), labels[r].reshape(GRID, GRID))
        if problem:
            raise MazeError(f"{where} row {r}: {problem}")


_FOUR = ndimage.generate_binary_structure(2, 1)  # 4-connectivity: no diagonal steps


def _maze_problem(x: np.ndarray, y: np.ndarray) -> str | None:
    if (x == PATH).any():
        return "the question already contains path cells 'o'"
    for tok, ch in ((START, "S"), (GOAL, "G")):
        if (x == tok).sum() != 1:
            return f"the question has {(x == tok).sum()} '{ch}' cells, expected 1"
    bad = (x != y) & ~((x == OPEN) & (y == PATH))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        return (
            f"the answer changes cell ({i}, {j}) from {CHARSET[x[i, j] - 1]!r} to "
            f"{CHARSET[y[i, j] - 1]!r}; only ' ' -> 'o' is allowed"
        )
    comp, _ = ndimage.label((y == PATH) | (y == START) | (y == GOAL), structure=_FOUR)
    s_comp, g_comp = comp[y == START][0], comp[y == GOAL][0]
    if s_comp != g_comp:
        return "the path cells do not connect S to G (4-connected)"
    stray = (y == PATH) & (comp != s_comp)
    if stray.any():
        i, j = np.argwhere(stray)[0]
        return f"path cell ({i}, {j}) is not connected to the S-G path"
    return None


def read_csv(path) -> tuple[np.ndarray, np.ndarray]:
    path = Path(path)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or [c.strip() for c in rows[0][:3]] != ["source", "question", "answer"]:
        head = rows[0] if rows else "<empty file>"
        raise MazeError(f"{path}: expected header source,question,answer,rating, got {head}")
    body = rows[1:]
    for r, row in enumerate(body):
        if len(row) < 3:
            raise MazeError(f"{path} row {r}: {len(row)} columns, expected 4")
    inputs = encode_grids([row[1] for row in body], f"{path} (question)")
    labels = encode_grids([row[2] for row in body], f"{path} (answer)")
    return inputs, labels


def download(filename: str, dest_dir: Path, repo: str = HF_REPO) -> Path:
    url = HF_URL.format(repo=repo, filename=filename)
    return fetch(
        url,
        Path(dest_dir) / filename,
        offline_hint="pass --source with train.csv/test.csv or an upstream-built data set folder",
    )


def _load_source(source, cache_dir: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
    if source is None:
        return {s: read_csv(download(f"{s}.csv", cache_dir)) for s in ("train", "test")}, HF_REPO
    source = Path(source)
    if (source / "train" / "dataset.json").exists():  # already in upstream layout
        out = {}
        for split in ("train", "test"):
            a = load_split(source, split, raw=True).all
            out[split] = (np.asarray(a.inputs), np.asarray(a.labels))
            if a.num_puzzles != a.num_groups:
                raise MazeError(
                    f"{source}/{split}: {a.num_puzzles} puzzles in {a.num_groups} groups; "
                    "expected an unaugmented build (one maze per group)"
                )
        return out, str(source)
    if (source / "train.csv").exists():
        return {s: read_csv(source / f"{s}.csv") for s in ("train", "test")}, str(source)
    raise FileNotFoundError(
        f"{source}: expected train.csv + test.csv, or an upstream-built folder with train/dataset.json"
    )


def _to_arrays(inputs, labels, aug: bool) -> PuzzleArrays:
    n = inputs.shape[0]
    k = 8 if aug else 1
    if aug:  # group g = maze g under transforms 0..7, each its own puzzle of one example
        x = inputs.reshape(n, GRID, GRID)
        y = labels.reshape(n, GRID, GRID)
        inputs = np.stack([dihedral_transform(x, t) for t in range(8)], 1).reshape(n * 8, SEQ_LEN)
        labels = np.stack([dihedral_transform(y, t) for t in range(8)], 1).reshape(n * 8, SEQ_LEN)
    return PuzzleArrays(
        inputs=np.ascontiguousarray(inputs, dtype=np.uint8),
        labels=np.ascontiguousarray(labels, dtype=np.uint8),
        puzzle_identifiers=np.zeros(n * k, dtype=np.int32),
        puzzle_indices=np.arange(n * k + 1, dtype=np.int32),
        group_indices=np.arange(0, n * k + 1, k, dtype=np.int32),
    )


def build(
    out_dir,
    *,
    source=None,
    aug: bool = False,
    subsample_size: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    cache_dir=None,
    built_by: dict | None = None,
) -> dict:
    t0 = time.time()
    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite)
    data, origin = _load_source(source, Path(cache_dir or out_dir.parent / ".maze_download"))
    splits, summary = {}, {"source": origin}
    for split in tqdm(("train", "test"), desc="maze"):
        inputs, labels = data[split]
        validate_mazes(inputs, labels, f"{origin} [{split}]")
        if split == "train" and subsample_size is not None and subsample_size < len(inputs):
            keep = np.sort(
                np.random.default_rng(seed).choice(len(inputs), subsample_size, replace=False)
            )
            inputs, labels = inputs[keep], labels[keep]
        arrays = _to_arrays(inputs, labels, aug and split == "train")
        # Upstream counts groups as "puzzles" with one example each (as its Sudoku builder).
        meta = make_metadata(
            arrays,
            vocab_size=VOCAB_SIZE,
            num_puzzle_identifiers=1,
            total_puzzles=arrays.num_groups,
            mean_puzzle_examples=1.0,
        )
        splits[split] = (meta, {"all": arrays})
        summary[f"{split}_mazes"] = int(inputs.shape[0])
        summary[f"{split}_examples"] = arrays.num_examples
    write_dataset(out_dir, splits, ["<blank>"], overwrite=overwrite, built_by=built_by)
    summary["bytes"] = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    summary["seconds"] = round(time.time() - t0, 2)
    return summary


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = cli.parser("data.maze", __doc__)
    p.add_argument("--out-dir", default="data_out/maze-30x30-hard-1k")
    p.add_argument(
        "--source",
        default=None,
        help="folder with train.csv/test.csv or an upstream-built data set "
        f"(default: download {HF_REPO})",
    )
    p.add_argument("--aug", action="store_true", help="8x dihedral augmentation of train")
    p.add_argument("--subsample-size", type=int, default=None, help="keep N train mazes")
    p.add_argument("--seed", type=int, default=0, help="seed of --subsample-size")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    summary = build(
        args.out_dir,
        source=args.source,
        aug=args.aug,
        subsample_size=args.subsample_size,
        seed=args.seed,
        overwrite=args.overwrite,
        built_by=provenance.record(
            "data.maze",
            provenance.command_args(argv, neutral=("--overwrite",)),
            {"source": args.source or f"https://huggingface.co/datasets/{HF_REPO}"},
        ),
    )
    return cli.print_summary(summary)


if __name__ == "__main__":
    cli.run(main)
