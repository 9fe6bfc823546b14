"""Offline Sudoku sets of chosen difficulty through data.sudoku: `trm_sudoku_tiny` (`make demo`,
30 blanks) and `trm_sudoku_cpu` (40 blanks).

Real Sudoku-Extreme needs ~65k steps of a 5M-parameter model; a laptop demo has minutes. So the
demo takes complete grids from data.sudoku's generator (seeded, unique-solution puzzles; we keep
their SOLUTIONS) and blanks only `blanks` random cells of each (by default among the generator
puzzle's own blanks, so the solution stays unique: `build_easy_sudoku`), then writes train/test splits with
data.sudoku.build_sudoku (its augmentation, checks and upstream on-disk layout). The test grids
come from a disjoint generator stream, so test accuracy measures generalisation, not recall.

    python -m data.sudoku_easy --output-dir DIR train=200 test=100 blanks=30 num_aug=20 [unique=0]

(the experiment's `data.build: sudoku_easy` + `data.build_args` call `main` the same way).
"""

from __future__ import annotations

import sys

import numpy as np

from data.sudoku import build_sudoku
from data.sudoku_sources import SudokuRecords, generate_records


def build_easy_sudoku(
    output_dir: str,
    *,
    train: int,
    test: int,
    blanks: int,
    num_aug: int,
    seed: int = 0,
    unique: bool = True,
) -> dict:
    """`unique` (default): the blanks are drawn among the blank cells of the generator's own
    puzzle (53-60 of them, and that puzzle has one solution), so every grid keeps exactly one
    solution: the label. unique=0 draws them among all 81 cells, as the golden fixtures' small
    sets were made; with many blanks such a grid often has other solutions, which exact accuracy
    scores as wrong (measured: 117 of 200 grids at 40 blanks, 18 of 100 at 30)."""

    def easy(n, start, stream):
        records = generate_records(n, seed, start=start)
        solved = records.answers
        rng = np.random.default_rng((seed, stream))
        questions = solved.copy()
        for row, puzzle in zip(questions, records.questions, strict=True):
            cells = np.flatnonzero(puzzle == 0) if unique else np.arange(81)
            if blanks > cells.size:
                raise ValueError(
                    f"sudoku_easy: blanks={blanks} but a generated puzzle has only {cells.size} "
                    "blank cells to keep its solution unique; use blanks <= 53 or unique=0"
                )
            row[rng.choice(cells, size=blanks, replace=False)] = 0
        origin = f"easy(blanks={blanks}, unique={int(bool(unique))})"
        return SudokuRecords(questions, solved, np.zeros(n), origin=origin)

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
