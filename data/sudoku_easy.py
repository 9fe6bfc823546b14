"""Offline Sudoku sets of chosen difficulty through data.sudoku: those of `trm_sudoku_tiny` (`make
demo`) and `trm_sudoku_cpu`, each built with the `blanks` its experiment's data.build_args give.

Real Sudoku-Extreme needs ~65k steps of a 5M-parameter model; a laptop demo has minutes. So the
demo takes complete grids from data.sudoku's generator (seeded, unique-solution puzzles; we keep
their SOLUTIONS) and blanks only `blanks` cells of each (by default among the generator
puzzle's own blanks, so the solution stays unique: `build_easy_sudoku`), then writes train/test splits with
data.sudoku.build_sudoku (its augmentation, checks and upstream on-disk layout). The test grids
come from a disjoint generator stream, so test accuracy measures generalisation, not recall.

    python -m data.sudoku_easy --output-dir DIR train=200 test=100 blanks=30 num_aug=20 \
        [unique=0] [pattern=uniform|published|mixed]

(the experiment's `data.build: sudoku_easy` + `data.build_args` call `main` the same way).
`pattern` says where the blanks lie (`blank_cells`): at random (uniform, the default), as printed
puzzles have them (published: symmetric, in patches), or either per grid (mixed, the demo's).

`test_csv=PATH` makes the test split of grids from another source instead: the SOLUTIONS of the
first `test` puzzles of a Sudoku CSV (columns source,question,answer,rating) with `blanks` cells
blanked the same way (among each CSV puzzle's own blanks, so every grid keeps one solution);
train=0 writes no train split. The demo's checkpoints evaluated on such grids
(docs/training.md, "Tiny runs"):

    python -m data.sudoku_easy --output-dir data_out/sudoku-hard-1k-30p train=0 test=1000 \
        blanks=30 num_aug=0 test_csv=../shared/data/sudoku/sudoku-hard-test-1k/test.csv \
        pattern=published
    python -m train.evaluate runs/trm_sudoku_tiny --data data_out/sudoku-hard-1k-30p
"""

from __future__ import annotations

import inspect
import sys

import numpy as np

from data import cli, provenance
from data.sudoku import build_sudoku
from data.sudoku_sources import SudokuRecords, generate_records, read_sudoku_csv

PATTERNS = ("uniform", "published", "mixed")
_ROW, _COL = np.arange(81) // 9, np.arange(81) % 9


def _distance(cells: np.ndarray, anchors) -> np.ndarray:
    """Chebyshev distance (rows and columns) of each cell to the nearest of `anchors`."""
    return np.min(
        [np.maximum(abs(_ROW[cells] - _ROW[a]), abs(_COL[cells] - _COL[a])) for a in anchors], 0
    )


def blank_cells(own: np.ndarray, blanks: int, pattern: str, rng: np.random.Generator):
    """`blanks` cells among `own` (a puzzle's blank cells, so its solution stays unique), laid out
    as `pattern` says:

    - uniform: drawn at random;
    - published: as printed puzzles lay them out, symmetric under a half turn and in patches:
      the pairs (c, 80 - c) of `own` nearest a random cell and its half-turn image (a cell whose
      image is a clue only to make up the count);
    - mixed: one of the two, at random.
    """
    if pattern == "mixed":
        pattern = PATTERNS[rng.integers(2)]
    if pattern == "uniform":
        return rng.choice(own, size=blanks, replace=False)
    jitter = rng.random(81)
    anchor = rng.integers(81)
    jitter = np.minimum(jitter, jitter[::-1])  # one draw per pair: a pair stays together
    blank = np.zeros(81, bool)
    blank[own] = True
    paired = own[blank[80 - own] & ((own != 40) | (blanks % 2 == 1))]  # the centre: odd counts
    order = paired[np.argsort(_distance(paired, (anchor, 80 - anchor)) + jitter[paired])]
    chosen = np.zeros(81, bool)
    for c in order:
        group = (c,) if c == 40 else (c, 80 - c)
        if not chosen[c] and chosen.sum() + len(group) <= blanks:
            chosen[list(group)] = True
    if chosen.sum() < blanks:  # too few pairs: the nearest other blanks make up the count
        rest = own[~chosen[own]]
        rest = rest[np.argsort(_distance(rest, (anchor, 80 - anchor)) + jitter[rest])]
        chosen[rest[: blanks - chosen.sum()]] = True
    return np.flatnonzero(chosen)


def build_easy_sudoku(
    output_dir: str,
    *,
    train: int,
    test: int,
    blanks: int,
    num_aug: int,
    seed: int = 0,
    unique: bool = True,
    test_csv: str | None = None,
    pattern: str = "uniform",
    built_by: dict | None = None,
) -> dict:
    """`unique` (default): the blanks are drawn among the blank cells of the generator's own
    puzzle (53-60 of them, and that puzzle has one solution), so every grid keeps exactly one
    solution: the label. unique=0 draws them among all 81 cells, as the golden fixtures' small
    sets were made; with many blanks such a grid often has other solutions, which exact accuracy
    scores as wrong (measured: 117 of 200 grids at 40 blanks, 18 of 100 at 30). `test_csv`: the
    test grids come from this CSV's first `test` puzzles instead (module docstring); train=0: no
    train split. `pattern`: how the blanks lie (`blank_cells`; not with unique=0). `built_by`:
    the record written beside (data.provenance; main writes one)."""
    if pattern not in PATTERNS:
        raise ValueError(f"sudoku_easy: pattern={pattern!r}: expected one of {', '.join(PATTERNS)}")
    if pattern != "uniform" and not unique:
        raise ValueError(
            f"sudoku_easy: pattern={pattern} draws among a puzzle's own blanks: not with unique=0"
        )

    def source(n, start):
        if start == 0 or test_csv is None:
            return generate_records(n, seed, start=start)
        records = read_sudoku_csv(test_csv)
        if n > len(records):
            raise ValueError(f"sudoku_easy: test={n} but {test_csv} has {len(records)} puzzles")
        return records.take(np.arange(n))

    def easy(n, start, stream):
        records = source(n, start)
        solved = records.answers
        rng = np.random.default_rng((seed, stream))
        questions = solved.copy()
        for row, puzzle in zip(questions, records.questions, strict=True):
            cells = np.flatnonzero(puzzle == 0) if unique else np.arange(81)
            if blanks > cells.size:
                generated = start == 0 or test_csv is None
                what = "generated puzzle" if generated else f"puzzle of {test_csv}"
                most = 53 if generated else cells.size
                raise ValueError(
                    f"sudoku_easy: blanks={blanks} but a {what} has only {cells.size} blank cells "
                    f"to keep its solution unique; use blanks <= {most} or unique=0"
                )
            row[blank_cells(cells, blanks, pattern, rng)] = 0
        origin = f"easy(blanks={blanks}, unique={int(bool(unique))}, pattern={pattern}, from={records.origin})"
        return SudokuRecords(questions, solved, np.zeros(n), origin=origin)

    return build_sudoku(
        output_dir,
        easy(train, 0, 0) if train else None,
        easy(test, 1 << 20, 1),
        num_aug=num_aug,
        seed=seed,
        overwrite=True,
        built_by=built_by,
    )


_PARAMS = inspect.signature(build_easy_sudoku).parameters
KEYS = tuple(
    k for k in _PARAMS if k not in ("output_dir", "built_by")
)  # main's key=value arguments
REQUIRED = tuple(k for k in KEYS if _PARAMS[k].default is inspect.Parameter.empty)


def _parse(argv: list[str]) -> tuple[dict, str | None, list[str]]:
    """-> (build_easy_sudoku's keyword arguments, --output-dir, the key=value arguments as
    given). ValueError naming the argument for a bad one (an unknown key, a number that is not
    one)."""
    kw, out, given = {}, None, []
    it = iter(argv)
    for a in it:
        if a == "--output-dir":
            out = next(it, None)
            continue
        k, eq, v = a.partition("=")
        if not eq or k not in KEYS:
            raise ValueError(
                f"sudoku_easy: {a!r}: expected key=value, key one of {', '.join(KEYS)}"
            )
        try:
            kw[k] = v if k in ("test_csv", "pattern") else int(v)
        except ValueError:
            raise ValueError(f"sudoku_easy: {a!r}: {k} must be a whole number") from None
        given.append(a)
    return kw, out, given


def build_record(argv: list[str]) -> dict:
    """The record (data.provenance) `main(argv)` writes into its output folder."""
    kw, _, given = _parse(argv)
    return provenance.record("data.sudoku_easy", given, {"test_csv": kw.get("test_csv")})


def main(argv: list[str]) -> dict:
    """CLI-style entry used by the trainer's data.build hook: --output-dir DIR key=value ...
    ValueError naming the argument for a bad one (an unknown key, a number that is not one)."""
    kw, out, _ = _parse(argv)
    missing = [k for k in REQUIRED if k not in kw]
    if out is None or missing:
        raise ValueError(
            "sudoku_easy: expected --output-dir DIR and "
            + " ".join(f"{k}=N" for k in REQUIRED)
            + (f"; missing {', '.join(missing)}" if missing else "; missing --output-dir")
        )
    return build_easy_sudoku(out, **kw, built_by=build_record(argv))


if __name__ == "__main__":
    cli.run(main, sys.argv[1:])
