"""Puzzles as boards: the answer being refined ACT step by ACT step (`python -m train.evaluate
--show N`).

    boards = puzzle_boards(inputs_l, labels_l, step_preds_sl, step_halts_s, seq_len, vocab, rows)
    boards, note = shown(boards, n)     # those the recursion fixes first; a note when too few
    print(render_text(boards, halting=False))  # input | step 1 | ... | step S | answer
    save_png(boards, "show.png")        # one row per puzzle, one column per board (matplotlib)
    save_gif(boards, "show.gif")        # one frame per ACT step

The kind of board comes from the data set's sizes (upstream encodings): Sudoku (seq_len 81,
vocab 11: 0 pad, 1 blank, 2..10 the digits), Maze (seq_len 900, vocab 6: 1 + index in "# SGo"),
ARC (seq_len 900, vocab 12: 0 pad, 1 end of grid, 2..11 colours 0..9; cropped to the answer's
grid). Anything else with a square seq_len is drawn as raw token ids. A wrong cell (prediction !=
answer where the answer is labelled) is marked `*` in text and with a red cross in images.
"""

from __future__ import annotations

import dataclasses
import math
import shutil

import numpy as np

from data.arc import COLOUR_OFFSET
from data.arc_eval import crop_shapes
from train.errors import ConfigError

MAZE_CHARSET = "# SGo"  # data.maze.CHARSET (kept here so rendering needs no data builder)
IGNORE = -100


@dataclasses.dataclass
class Board:
    """One puzzle's grids, cropped to what is shown: inputs, answer, each step's prediction."""

    kind: str  # sudoku | maze | arc | grid
    inputs: np.ndarray  # [h, w] tokens
    answer: np.ndarray  # [h, w] tokens (IGNORE where unlabelled)
    steps: list[np.ndarray]  # [h, w] tokens per ACT step
    halts: list[bool]  # the Q head's halting decision after each step
    row: int = 0  # the puzzle's row in the test split

    def wrong(self, s: int) -> np.ndarray:
        return (self.answer != IGNORE) & (self.steps[s] != self.answer)

    def solved_at(self) -> int | None:
        """First ACT step (1-based) whose prediction is entirely right, or None."""
        for s in range(len(self.steps)):
            if not self.wrong(s).any():
                return s + 1
        return None

    def fixed_by_recursion(self) -> bool:
        """Wrong after the first ACT step and entirely right after the last."""
        return bool(self.wrong(0).any()) and not self.wrong(len(self.steps) - 1).any()

    def status(self) -> str:
        solved, last = self.solved_at(), len(self.steps)
        if solved is None:
            return "not solved"
        if self.wrong(last - 1).any():
            return f"solved at ACT step {solved}, wrong again at step {last}"
        if solved == 1:
            return "solved at ACT step 1"
        before = "step 1" if solved == 2 else f"steps 1-{solved - 1}"
        return f"wrong after ACT {before}, solved at step {solved}"


def board_kind(seq_len: int, vocab_size: int) -> str:
    if seq_len == 81 and vocab_size == 11:
        return "sudoku"
    if seq_len == 900 and vocab_size == 6:
        return "maze"
    if seq_len == 900 and vocab_size == 12:
        return "arc"
    if math.isqrt(seq_len) ** 2 != seq_len:
        raise ValueError(f"--show: seq_len={seq_len} is not a square grid; nothing to draw")
    return "grid"


def puzzle_boards(inputs, labels, step_preds, step_halts, seq_len: int, vocab_size: int, rows=None):
    """Boards of N puzzles: inputs/labels [N, L], step_preds [S, N, L], step_halts [S, N];
    `rows` [N] their rows in the test split (default 0..N-1)."""
    kind = board_kind(seq_len, vocab_size)
    side = math.isqrt(seq_len)
    inputs = np.asarray(inputs).reshape(-1, side, side)
    labels = np.asarray(labels).reshape(-1, side, side)
    preds = np.asarray(step_preds).reshape(len(step_preds), -1, side, side)
    halts = np.asarray(step_halts)
    boards = []
    for i in range(len(inputs)):
        h = w = side
        hi, wi = side, side
        if kind == "arc":  # crop to the answer's grid (and the input to its own)
            h, w = crop_shapes(np.where(labels[i] == IGNORE, 0, labels[i])[None])[0]
            hi, wi = crop_shapes(inputs[i][None])[0]
        boards.append(
            Board(
                kind,
                inputs[i][:hi, :wi],
                labels[i][:h, :w],
                [p[i][:h, :w] for p in preds],
                [bool(x) for x in halts[:, i]],
                i if rows is None else int(rows[i]),
            )
        )
    return boards


def shown(boards: list[Board], n: int, count: int | None = None) -> tuple[list[Board], str | None]:
    """The `n` boards `--show n` draws: the puzzles the recursion fixes (wrong after ACT step 1,
    right after the last step) in test order, then the first others; and one line saying so when
    fewer than `n` are fixed (None otherwise). `count`: how many puzzles were looked at (default
    len(boards); a caller may pass only the fixed ones and the first `n` others)."""
    fixed = [b for b in boards if b.fixed_by_recursion()]
    others = [b for b in boards if not b.fixed_by_recursion()]
    note = None
    if len(fixed) < n and boards:
        count = len(boards) if count is None else count
        last = len(boards[0].steps)
        if fixed:
            note = (
                f"only {len(fixed)} of {count} test puzzles are wrong after ACT step 1 and right "
                f"after step {last}; shown first, then the first others"
            )
        else:
            note = (
                f"none of {count} test puzzles is wrong after ACT step 1 and right after step "
                f"{last}; showing the first"
            )
    return fixed[:n] + others[: max(n - len(fixed), 0)], note


def _cell(kind: str, tok: int) -> str:
    if tok == IGNORE:
        return " "
    if kind == "sudoku":
        return "." if tok <= 1 else str(tok - 1)
    if kind == "maze":
        return MAZE_CHARSET[tok - 1] if 1 <= tok <= len(MAZE_CHARSET) else "?"
    if kind == "arc":
        return str(tok - COLOUR_OFFSET) if COLOUR_OFFSET <= tok < COLOUR_OFFSET + 10 else "."
    return str(tok % 10)


def _grid_lines(kind: str, grid: np.ndarray, wrong: np.ndarray | None = None) -> list[str]:
    lines = []
    for r in range(grid.shape[0]):
        cells = []
        for c in range(grid.shape[1]):
            mark = "*" if wrong is not None and wrong[r, c] else " "
            cells.append(_cell(kind, int(grid[r, c])) + mark)
        lines.append("".join(cells))
    return lines


def _titled(title: str, lines: list[str]) -> list[str]:
    width = max([len(title)] + [len(x) for x in lines])
    return [title.ljust(width)] + [x.ljust(width) for x in lines]


def halt_mark(b: Board, s: int, halting: bool) -> str:
    """What step `s`'s title says of the Q head: with halting on (`--halt`), "halted" at the
    step the row stops at; without, "q: halt" where the Q head says halt, which is not applied."""
    if not b.halts[s]:
        return ""
    if not halting:
        return "q: halt"
    return "halted" if s == b.halts.index(True) else ""


def render_text(boards: list[Board], width: int | None = None, halting: bool = False) -> str:
    """input | step 1 .. step S | answer, side by side (wrapped to the terminal width);
    `*` marks a wrong cell, `halt_mark` the Q head's halting."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    legend = (
        "halted = the row's answer" if halting else "q: halt = the Q head would stop, not applied"
    )
    out = []
    for b in boards:
        out.append(
            f"test puzzle {b.row}: {b.status()} ({len(b.steps)} steps; * = wrong cell; {legend})"
        )
        panels = [_titled("input", _grid_lines(b.kind, b.inputs))]
        for s in range(len(b.steps)):
            mark = halt_mark(b, s, halting)
            title = f"step {s + 1}" + (f" ({mark})" if mark else "")
            panels.append(_titled(title, _grid_lines(b.kind, b.steps[s], b.wrong(s))))
        panels.append(_titled("answer", _grid_lines(b.kind, b.answer)))
        out.extend(_side_by_side(panels, width))
    return "\n".join(out)


def _side_by_side(panels: list[list[str]], width: int) -> list[str]:
    out, row = [], []
    for p in panels + [None]:
        used = sum(len(q[0]) + 3 for q in row)
        if p is None or (row and used + len(p[0]) > width):
            height = max(len(q) for q in row)
            for r in range(height):
                out.append(" | ".join(q[r] if r < len(q) else " " * len(q[0]) for q in row))
            out.append("")
            row = []
        if p is not None:
            row.append(p)
    return out


# --- images (matplotlib: pip install -e .[plot]) ----------------------------------------------
def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install -e '.[plot]'") from None
    return plt


def check_plot_possible() -> None:
    """ConfigError now, before any compute, when --plot could not draw at the end."""
    _pyplot()


def _draw(ax, b: Board, grid: np.ndarray, wrong: np.ndarray | None, title: str) -> None:
    img = np.where(grid == IGNORE, 0, grid)
    ax.imshow(img, cmap="tab20", vmin=0, vmax=19, interpolation="nearest")
    if b.kind == "sudoku":
        for (r, c), tok in np.ndenumerate(grid):
            if tok > 1:
                ax.text(c, r, str(tok - 1), ha="center", va="center", fontsize=6)
    if wrong is not None and wrong.any():
        rr, cc = np.nonzero(wrong)
        ax.scatter(cc, rr, marker="x", c="red", s=12, linewidths=1)
    ax.set_title(title, fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])


def _figure(plt, boards: list[Board], step: int | None, halting: bool):
    """All boards (step None) or one step's frame: input | step(s) | answer per puzzle."""
    steps = range(len(boards[0].steps)) if step is None else [step]
    cols = len(steps) + 2
    fig, axes = plt.subplots(
        len(boards), cols, figsize=(1.4 * cols, 1.5 * len(boards)), squeeze=False
    )
    for i, b in enumerate(boards):
        _draw(axes[i][0], b, b.inputs, None, "input")
        for j, s in enumerate(steps):
            mark = halt_mark(b, s, halting)
            title = f"step {s + 1}" + (f" ({mark})" if mark else "")
            _draw(axes[i][j + 1], b, b.steps[s], b.wrong(s), title)
        _draw(axes[i][-1], b, b.answer, None, "answer")
    fig.tight_layout()
    return fig


def save_png(boards: list[Board], path: str, halting: bool = False) -> str:
    plt = _pyplot()
    fig = _figure(plt, boards, None, halting)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save_gif(boards: list[Board], path: str, halting: bool = False) -> str:
    """One frame per ACT step (input | prediction | answer for every puzzle)."""
    plt = _pyplot()
    from PIL import Image  # matplotlib's own dependency

    frames = []
    for s in range(len(boards[0].steps)):
        fig = _figure(plt, boards, s, halting)
        fig.canvas.draw()
        frames.append(Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]))
        plt.close(fig)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=600, loop=0)
    return path


def save_accuracy_plot(per_step: dict, halt_max_steps: int, path: str, title: str = "") -> str:
    """Exact and token accuracy after every ACT step; a dashed line at halt_max_steps (where
    upstream's evaluation stops)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    steps = np.arange(1, len(per_step["exact_accuracy"]) + 1)
    ax.plot(steps, per_step["exact_accuracy"], marker="o", label="exact accuracy")
    ax.plot(steps, per_step["token_accuracy"], marker=".", label="token accuracy")
    if len(steps) > halt_max_steps:
        ax.axvline(halt_max_steps, ls="--", c="grey", label="halt_max_steps")
    ax.set_xlabel("ACT step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
