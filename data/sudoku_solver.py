"""A small, fast pure-Python Sudoku solver, solution counter and puzzle generator.

Grids are 81 ints in row-major order, 0 = blank, 1..9 = digits (a list, tuple, str with '.'/'0'
blanks, or numpy array all work as input).

API
---
- ``solve(grid, *, limit=1)`` -> ``SolveResult(num_solutions, solution, nodes, guesses)``:
  depth-first search over bitmasks with naked and hidden singles propagated at every node and the
  most-constrained cell (MRV) branched on; stops after ``limit`` solutions. ``guesses`` (trial
  placements, counted with limit=2 so the uniqueness proof is included) is the difficulty rating:
  0 = singles alone solve it.
- ``count_solutions(grid, limit=2)``: 0, 1 or ``limit`` (= "at least limit").
- ``generate_puzzle(rng)`` -> ``(puzzle, solution, rating)``: a random full grid, then clues removed
  in random order while the solution stays unique, i.e. a minimal puzzle with exactly one solution.
- ``generate_puzzles(n, seed, *, min_rating=0, workers=1, start=0)`` -> ``(puzzles [n, 81],
  solutions [n, 81], ratings [n])`` (uint8, uint8, int64); puzzle ``i`` depends only on
  ``(seed, start + i)``, so the result is the same for any number of workers.

Why pure Python: the project's dependencies are only what the ports need (no numba, no C
extension). Uniqueness checks reuse one trick: after removing clue ``c`` from a puzzle whose unique
solution is ``S``, the smaller puzzle is still unique iff it has no solution with ``c != S[c]``
(every solution with ``c == S[c]`` solves the old puzzle, so it is ``S``); that is one "find any"
search with the old digit forbidden, instead of counting to 2.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tqdm import tqdm

_ALL = 0x1FF
_POP = [bin(m).count("1") for m in range(512)]
_DIGITS = [[d + 1 for d in range(9) if m >> d & 1] for m in range(512)]  # digits in a mask
_ROW = [c // 9 for c in range(81)]
_COL = [c % 9 for c in range(81)]
_BOX = [(c // 27) * 3 + (c % 9) // 3 for c in range(81)]
_UNITS = (
    [[r * 9 + c for c in range(9)] for r in range(9)]
    + [[r * 9 + c for r in range(9)] for c in range(9)]
    + [[(b // 3) * 27 + (b % 3) * 3 + (i // 3) * 9 + i % 3 for i in range(9)] for b in range(9)]
)


@dataclasses.dataclass
class SolveResult:
    num_solutions: int  # capped at the limit
    solution: list[int] | None  # first solution found
    nodes: int  # search nodes visited
    guesses: int  # trial placements made (difficulty rating: 0 = singles alone solve it)


def to_grid(grid) -> list[int]:
    """81 ints 0..9 from a str ('.' or '0' blank), sequence or array; raises ValueError otherwise."""
    if isinstance(grid, str):
        if len(grid) != 81:
            raise ValueError(f"a Sudoku string has 81 characters, got {len(grid)}")
        out = [0 if ch in ".0" else (ord(ch) - 48) for ch in grid]
    else:
        out = [int(v) for v in np.asarray(grid).reshape(-1)]
        if len(out) != 81:
            raise ValueError(f"a Sudoku grid has 81 cells, got {len(out)}")
    if any(not 0 <= v <= 9 for v in out):
        raise ValueError(f"Sudoku cells must be 0 (blank) or 1..9, got {grid!r}")
    return out


class _Search:
    """One DFS over a grid. State: used-digit masks per row/col/box; ``cells`` is mutated."""

    def __init__(self, cells: list[int], limit: int, forbid: dict[int, int] | None = None):
        self.cells = cells
        self.limit = limit
        # At most one forbidden (cell, digit mask): all the uniqueness check needs.
        ((self.forbid_cell, self.forbid_mask),) = (forbid or {-1: 0}).items()
        self.rows, self.cols, self.boxes = [0] * 9, [0] * 9, [0] * 9
        self.count, self.nodes, self.guesses, self.solution = 0, 0, 0, None
        self.consistent = True
        for c, v in enumerate(cells):
            if v:
                bit = 1 << (v - 1)
                r, k, b = _ROW[c], _COL[c], _BOX[c]
                if (self.rows[r] | self.cols[k] | self.boxes[b]) & bit:
                    self.consistent = False  # the givens already clash
                self.rows[r] |= bit
                self.cols[k] |= bit
                self.boxes[b] |= bit
        self.empty = [c for c in range(81) if not cells[c]]

    def _place(self, c: int, d: int) -> None:
        bit = 1 << (d - 1)
        self.cells[c] = d
        self.rows[_ROW[c]] |= bit
        self.cols[_COL[c]] |= bit
        self.boxes[_BOX[c]] |= bit

    def _unplace(self, c: int, d: int) -> None:
        bit = ~(1 << (d - 1))
        self.cells[c] = 0
        self.rows[_ROW[c]] &= bit
        self.cols[_COL[c]] &= bit
        self.boxes[_BOX[c]] &= bit

    def run(self) -> None:
        if self.consistent:
            self._dfs(len(self.empty))

    def _dfs(self, n_empty: int) -> None:
        self.nodes += 1
        if n_empty == 0:
            self.count += 1
            if self.solution is None:
                self.solution = list(self.cells)
            return
        empty, cells, rows, cols, boxes = self.empty, self.cells, self.rows, self.cols, self.boxes
        fc, fm = self.forbid_cell, self.forbid_mask
        # Forced moves first (naked singles, then hidden singles), undone on return.
        placed = []
        while True:
            best_c, best_m, best_n = -1, 0, 10
            progress = False
            cand = [0] * 81
            for c in empty:
                if cells[c]:
                    continue
                m = _ALL & ~(rows[_ROW[c]] | cols[_COL[c]] | boxes[_BOX[c]])
                if c == fc:
                    m &= ~fm
                n = _POP[m]
                if n == 0:
                    return self._undo(placed)
                if n == 1:
                    self._place(c, _DIGITS[m][0])
                    placed.append(c)
                    progress = True
                elif n < best_n:
                    best_c, best_m, best_n = c, m, n
                cand[c] = m
            if progress:
                continue  # candidates changed: rescan
            if len(placed) == n_empty:
                break
            hidden = self._hidden_singles(cand)
            if hidden is None:
                return self._undo(placed)  # some unit has no place for some digit: dead end
            if not hidden:
                break
            for c, d in hidden:
                bit = 1 << (d - 1)
                if (rows[_ROW[c]] | cols[_COL[c]] | boxes[_BOX[c]]) & bit:
                    return self._undo(placed)  # two hidden singles clash
                self._place(c, d)
                placed.append(c)
        left = n_empty - len(placed)
        if left == 0:
            self._dfs(0)
            return self._undo(placed)
        for d in _DIGITS[best_m]:
            self.guesses += 1
            self._place(best_c, d)
            self._dfs(left - 1)
            self._unplace(best_c, d)
            if self.count >= self.limit:
                break
        self._undo(placed)

    def _hidden_singles(self, cand: list[int]):
        """(cell, digit) pairs where a digit has one place left in a unit; None on a dead end."""
        cells, found = self.cells, {}
        for unit in _UNITS:
            once = twice = placed = 0
            for c in unit:
                v = cells[c]
                if v:
                    placed |= 1 << (v - 1)
                else:
                    m = cand[c]
                    twice |= once & m
                    once |= m
            if (once | placed) != _ALL:
                return None
            only = once & ~twice & ~placed
            if only:
                for c in unit:
                    m = cand[c] & only
                    if m and not cells[c]:
                        if _POP[m] > 1:
                            return None  # one cell is the only place for two digits
                        d = _DIGITS[m][0]
                        if found.setdefault(c, d) != d:
                            return None
        return list(found.items())

    def _undo(self, placed: list[int]) -> None:
        for c in reversed(placed):
            self._unplace(c, self.cells[c])


def solve(grid, *, limit: int = 1) -> SolveResult:
    """Search for up to ``limit`` solutions of ``grid`` (see module docstring)."""
    s = _Search(to_grid(grid), limit)
    s.run()
    return SolveResult(min(s.count, limit), s.solution, s.nodes, s.guesses)


def count_solutions(grid, limit: int = 2) -> int:
    """Number of solutions of ``grid``, capped at ``limit`` (limit=2 decides uniqueness)."""
    return solve(grid, limit=limit).num_solutions


def _has_other_solution(puzzle: list[int], cell: int, digit: int) -> bool:
    """Does ``puzzle`` have a solution with ``puzzle[cell] != digit``? (cell must be blank)."""
    s = _Search(list(puzzle), 1, {cell: 1 << (digit - 1)})
    s.run()
    return s.count > 0


def _random_full_grid(rng: np.random.Generator) -> list[int]:
    # Seed the first row with a random permutation (always extendable), then let a randomised
    # search complete it: cheap and covers far more grids than permuting one fixed grid.
    cells = [0] * 81
    cells[:9] = [int(v) for v in rng.permutation(9) + 1]
    order = [int(v) for v in rng.permutation(81)]
    cells_by_order = [c for c in order if not cells[c]]
    s = _Search(cells, 1)
    s.empty = cells_by_order  # scan order breaks MRV ties at random
    s.run()
    assert s.solution is not None
    return s.solution


def solved_grids(n: int, rng: np.random.Generator) -> np.ndarray:
    """n random complete grids, uint8 [n, 81] of digits 1..9 (about 1 ms each)."""
    return np.asarray([_random_full_grid(rng) for _ in range(n)], np.uint8).reshape(n, 81)


def generate_puzzle(rng: np.random.Generator) -> tuple[list[int], list[int], int]:
    """One minimal uniquely-solvable puzzle: (puzzle, solution, rating = search nodes)."""
    solution = _random_full_grid(rng)
    puzzle = list(solution)
    for c in (int(v) for v in rng.permutation(81)):
        d = puzzle[c]
        puzzle[c] = 0
        if _has_other_solution(puzzle, c, d):
            puzzle[c] = d
    rating = solve(puzzle, limit=2).guesses
    return puzzle, solution, rating


def _generate_one(args: tuple[int, int, int]) -> tuple[list[int], list[int], int]:
    seed, index, min_rating = args
    rng = np.random.default_rng((seed, index))
    while True:
        puzzle, solution, rating = generate_puzzle(rng)
        if rating >= min_rating:
            return puzzle, solution, rating


def generate_puzzles(
    n: int,
    seed: int,
    *,
    min_rating: int = 0,
    workers: int = 1,
    start: int = 0,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` uniquely-solvable puzzles: (puzzles uint8 [n, 81], solutions uint8 [n, 81], ratings
    int64 [n]). Puzzle ``i`` depends only on ``(seed, start + i)`` (so disjoint ``start`` ranges give
    disjoint streams, e.g. train and test); ``min_rating`` rejects easier ones (rating = guesses)."""
    jobs = [(int(seed), start + i, int(min_rating)) for i in range(n)]
    workers = min(workers, max(1, n // 16))  # a process pool costs ~1 s to start
    bar = dict(total=n, desc="generate", unit="puzzle", disable=not progress)
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(workers) as pool:
            results = list(tqdm(pool.imap(_generate_one, jobs, chunksize=8), **bar))
    else:
        results = list(tqdm(map(_generate_one, jobs), **bar))
    puzzles = np.array([r[0] for r in results], dtype=np.uint8).reshape(n, 81)
    solutions = np.array([r[1] for r in results], dtype=np.uint8).reshape(n, 81)
    ratings = np.array([r[2] for r in results], dtype=np.int64)
    return puzzles, solutions, ratings
