"""The offline data set of `trm_sudoku_tiny` (`make demo`): EASY Sudokus through data.sudoku.

Real Sudoku-Extreme needs ~65k steps of a 5M-parameter model; a laptop demo has minutes. So the
demo takes complete grids from data.sudoku's generator (seeded, unique-solution puzzles; we keep
their SOLUTIONS) and blanks only `blanks` random cells of each, then writes train/test splits with
data.sudoku.build_sudoku (its augmentation, checks and upstream on-disk layout). The test grids
come from a disjoint generator stream, so test accuracy measures generalisation, not recall.

    python -m data.sudoku_easy --output-dir DIR train=200 test=100 blanks=8 num_aug=20

(the experiment's `data.build: sudoku_easy` + `data.build_args` call `main` the same way).
"""

from __future__ import annotations

import sys

import numpy as np

from data.sudoku import build_sudoku
from data.sudoku_sources import SudokuRecords, generate_records


def build_easy_sudoku(
    output_dir: str, *, train: int, test: int, blanks: int, num_aug: int, seed: int = 0
) -> dict:
    def easy(n, start, stream):
        solved = generate_records(n, seed, start=start).answers
        rng = np.random.default_rng((seed, stream))
        questions = solved.copy()
        for row in questions:
            row[rng.choice(81, size=blanks, replace=False)] = 0
        return SudokuRecords(questions, solved, np.zeros(n), origin=f"easy(blanks={blanks})")

    return build_sudoku(
        output_dir,
        easy(train, 0, 0),
        easy(test, 1 << 20, 1),
        num_aug=num_aug,
        seed=seed,
        overwrite=True,
    )


def main(argv: list[str]) -> dict:
    """CLI-style entry used by the trainer's data.build hook: --output-dir DIR key=value ..."""
    kw, out = {}, None
    it = iter(argv)
    for a in it:
        if a == "--output-dir":
            out = next(it)
        else:
            k, v = a.split("=", 1)
            kw[k] = int(v)
    return build_easy_sudoku(out, **kw)


if __name__ == "__main__":
    main(sys.argv[1:])
