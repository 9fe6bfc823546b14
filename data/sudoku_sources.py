"""Where Sudoku puzzles come from, each as `SudokuRecords` for data.sudoku's builder.

- the Sudoku-Extreme CSVs (columns source,question,answer,rating; '.' = blank; header row
  skipped), from a local directory (`read_sudoku_csv`) or downloaded from the Hugging Face hub
  (dataset sapientinc/sudoku-extreme, `download_sudoku_csv`);
- an upstream-format Sudoku data set (e.g. sudoku-extreme-1k): the first puzzle of every group is
  taken as the original (`read_upstream_sudoku`);
- puzzles with a unique solution made offline by data.sudoku_solver (`generate_records`;
  `generated_splits` for a train split and a test split from disjoint seed streams).

Digits here: 0 = blank, 1..9 (data.sudoku adds upstream's +1 token offset when writing).
"""

from __future__ import annotations

import csv
import dataclasses
import os

import numpy as np
from tqdm import tqdm

from data import sudoku_solver
from data.download import fetch
from data.puzzle_format import load_split

HF_REPO = "sapientinc/sudoku-extreme"
HF_URL = "https://huggingface.co/datasets/{repo}/resolve/main/{file}"
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "trm-jax", "sudoku-extreme")
VOCAB_SIZE = 11  # upstream's tokens: 0 = PAD, 1 = blank, 2..10 = digits
SEQ_LEN = 81


@dataclasses.dataclass
class SudokuRecords:
    """Puzzles as digits: questions [n, 81] (0 = blank), answers [n, 81] (1..9), ratings [n]."""

    questions: np.ndarray
    answers: np.ndarray
    ratings: np.ndarray
    origin: str = ""

    def __len__(self) -> int:
        return len(self.questions)

    def take(self, idx: np.ndarray) -> SudokuRecords:
        return SudokuRecords(self.questions[idx], self.answers[idx], self.ratings[idx], self.origin)


def read_sudoku_csv(path: str, *, progress: bool = False) -> SudokuRecords:
    """Read a Sudoku-Extreme CSV (source,question,answer,rating). Bad rows raise ValueError
    naming the file and line."""
    # bytearrays, not lists of bytes: the 3.8M-row train.csv then needs ~0.6 GB, not ~1.5 GB.
    questions, answers, ratings = bytearray(), bytearray(), []
    trans = bytes.maketrans(b".", b"0")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(
                f"{path}: empty file, expected a header row source,question,answer,rating"
            )
        rows = tqdm(reader, desc=f"read {os.path.basename(path)}", unit="row", disable=not progress)
        for line, row in enumerate(rows, start=2):
            if len(row) != 4:
                raise ValueError(
                    f"{path}:{line}: expected 4 columns source,question,answer,rating, got {len(row)}"
                )
            _, q, a, r = row
            if len(q) != 81 or len(a) != 81:
                raise ValueError(
                    f"{path}:{line}: question/answer must have 81 characters, got {len(q)}/{len(a)}"
                )
            qb, ab = q.encode().translate(trans), a.encode()
            if not (qb.isdigit() and ab.isdigit()) or b"0" in ab:
                raise ValueError(
                    f"{path}:{line}: question must be '.'/1-9 and answer 1-9, got {q!r}, {a!r}"
                )
            try:
                ratings.append(float(r))
            except ValueError:
                raise ValueError(f"{path}:{line}: rating {r!r} is not a number") from None
            questions += qb
            answers += ab
    n = len(ratings)
    qs = np.frombuffer(questions, np.uint8).reshape(n, 81) - ord("0")
    an = np.frombuffer(answers, np.uint8).reshape(n, 81) - ord("0")
    return SudokuRecords(qs, an, np.asarray(ratings, np.float64), origin=path)


def download_sudoku_csv(
    split: str, cache_dir: str = DEFAULT_CACHE, *, progress: bool = True
) -> str:
    """Path of ``<split>.csv`` in ``cache_dir``, downloaded from the hub first if absent."""
    name = f"{split}.csv"
    dest = os.path.join(cache_dir, name)
    if os.path.isfile(dest):
        return dest
    url = HF_URL.format(repo=HF_REPO, file=name)
    hint = "Use --csv-dir DIR (with train.csv/test.csv), --input-upstream DIR, or --generate N."
    return str(fetch(url, dest, offline_hint=hint, progress=progress))


def read_upstream_sudoku(root: str, split: str) -> SudokuRecords:
    """The original puzzle of each group of an upstream-format Sudoku data set."""
    s = load_split(root, split, raw=True)
    a, meta = s.all, s.metadata
    if meta.vocab_size != VOCAB_SIZE or meta.seq_len != SEQ_LEN:
        raise ValueError(
            f"{root}/{split}: vocab_size {meta.vocab_size}, seq_len {meta.seq_len}; a Sudoku set has "
            f"{VOCAB_SIZE}, {SEQ_LEN}"
        )
    first = a.puzzle_indices[a.group_indices[:-1]]  # first example of the first puzzle per group
    q = a.inputs[first].astype(np.int64) - 1
    ans = a.labels[first].astype(np.int64) - 1
    if q.min() < 0 or ans.min() < 1:
        raise ValueError(f"{root}/{split}: token 0 (PAD) in a Sudoku grid, or a blank in a label")
    return SudokuRecords(q.astype(np.uint8), ans.astype(np.uint8), np.zeros(len(q)), origin=root)


def generate_records(
    n: int,
    seed: int,
    *,
    start: int = 0,
    min_rating: int = 0,
    workers: int = 1,
    progress: bool = False,
) -> SudokuRecords:
    """``n`` generated puzzles with unique solutions; rating = solver guesses."""
    p, s, r = sudoku_solver.generate_puzzles(
        n, seed, start=start, min_rating=min_rating, workers=workers, progress=progress
    )
    return SudokuRecords(
        p, s, r.astype(np.float64), origin=f"generated(seed={seed}, start={start})"
    )


def generated_splits(
    num_train: int,
    num_test: int,
    seed: int,
    *,
    min_rating: int = 1,
    workers: int = 1,
    progress: bool = False,
) -> tuple[SudokuRecords, SudokuRecords | None]:
    """`num_train` + `num_test` generated puzzles, the test ones from the indices after the train
    ones (a disjoint stream); no test split when num_test is 0. What ``--generate N
    --generate-test M`` reads."""
    kw = dict(min_rating=min_rating, workers=workers, progress=progress)
    train = generate_records(num_train, seed, **kw)
    test = generate_records(num_test, seed, start=num_train, **kw) if num_test else None
    return train, test
