"""Build Sudoku data sets in the upstream TRM layout: ``python -m data.sudoku --help``.

Sources (one of):
  (default)              Sudoku-Extreme train.csv/test.csv downloaded from the Hugging Face hub
                         (dataset sapientinc/sudoku-extreme) into --cache-dir, when online;
  --csv-dir DIR          the same CSVs from a local directory (columns source,question,answer,rating;
                         '.' = blank; header row skipped);
  --input-upstream DIR   an upstream-format Sudoku data set (e.g. sudoku-extreme-1k); the first
                         puzzle of every group is taken as the original;
  --generate N           N puzzles with a unique solution made offline by data.sudoku_solver
                         (test split: --generate-test M more, from a disjoint seed stream).

Examples::

    python -m data.sudoku --output-dir data/sudoku-extreme-1k-aug-1000 --subsample-size 1000 --num-aug 1000
    python -m data.sudoku --generate 1000 --generate-test 200 --num-aug 100 --output-dir data/sudoku-gen

Python API: the sources are data.sudoku_sources (``SudokuRecords``: questions/answers uint8
[n, 81], 0 = blank, ratings [n]); here ``augment_sudoku(question, answer, num_aug, rng)``,
``check_sudoku_pairs(questions, answers)`` and ``build_sudoku(output_dir, train, test, *,
subsample_size, min_difficulty, num_aug, seed, overwrite)`` -> summary dict.

Encoding (upstream's): blank 0 / digits 1..9, then +1, so 0 = PAD, 1 = blank, 2..10 = digits;
vocab 11, seq_len 81, ignore_label_id 0 (never occurs: every cell is supervised), one puzzle
identifier (0), every example its own puzzle, a group = the original + its augmentations (index 0 =
original). Unlike upstream, everything is drawn from --seed, so two builds are byte-identical.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from data import cli, provenance
from data.cli import OneLineParser
from data.puzzle_format import PuzzleArrays, check_output_dir, make_metadata, write_dataset
from data.sudoku_sources import (
    DEFAULT_CACHE,
    VOCAB_SIZE,
    SudokuRecords,
    download_sudoku_csv,
    generate_records,
    generated_splits,
    read_sudoku_csv,
    read_upstream_sudoku,
)


# ------------------------------------------------------------------------------- augmentation
def augment_sudoku(
    question: np.ndarray, answer: np.ndarray, num_aug: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """[1 + num_aug, 81] questions and answers: row 0 the original, then validity-preserving
    transforms (digit relabelling with blank fixed, transpose with p=0.5, band shuffle + rows within
    bands, stack shuffle + columns within stacks), all drawn from ``rng``."""
    k = num_aug
    digit_map = np.zeros((k, 10), np.uint8)  # column 0 stays 0: blank is not relabelled
    digit_map[:, 1:] = rng.permuted(np.tile(np.arange(1, 10, dtype=np.uint8), (k, 1)), axis=1)
    transpose = rng.random(k) < 0.5
    rows = _line_permutation(rng, k)  # [k, 9]: output row i reads source row rows[i]
    cols = _line_permutation(rng, k)
    r, c = rows[:, :, None], cols[:, None, :]
    src = np.where(transpose[:, None, None], c * 9 + r, r * 9 + c).reshape(k, 81)
    q_aug = np.take_along_axis(digit_map, question[src].astype(np.intp), axis=1)
    a_aug = np.take_along_axis(digit_map, answer[src].astype(np.intp), axis=1)
    return np.concatenate([question[None], q_aug]), np.concatenate([answer[None], a_aug])


def _line_permutation(rng: np.random.Generator, k: int) -> np.ndarray:
    bands = rng.permuted(np.tile(np.arange(3), (k, 1)), axis=1)  # which band goes where
    within = rng.permuted(np.tile(np.arange(3), (k, 3, 1)), axis=2)  # rows inside each band
    return (bands[:, :, None] * 3 + within).reshape(k, 9)


def check_sudoku_pairs(questions: np.ndarray, answers: np.ndarray, where: str = "") -> None:
    """Vectorised: every answer is a valid full grid and agrees with every given of its question.
    Raises ValueError naming the first bad row."""
    q = questions.reshape(-1, 9, 9).astype(np.int64)
    a = answers.reshape(-1, 9, 9).astype(np.int64)
    boxes = a.reshape(-1, 3, 3, 3, 3).transpose(0, 1, 3, 2, 4).reshape(-1, 9, 9)
    want = np.arange(1, 10)
    ok = np.ones(len(a), bool)
    for lines in (a, a.transpose(0, 2, 1), boxes):
        ok &= (np.sort(lines, axis=2) == want).all(axis=(1, 2))
    ok &= ((q == 0) | (q == a)).all(axis=(1, 2))
    if not ok.all():
        bad = int(np.argmin(ok))
        raise ValueError(
            f"{where}row {bad}: answer is not a valid solution of its question\n"
            f"question {questions[bad].tolist()}\nanswer   {answers[bad].tolist()}"
        )


# ------------------------------------------------------------------------------------- building
def _split_arrays(
    questions: np.ndarray, answers: np.ndarray, group_sizes: np.ndarray
) -> PuzzleArrays:
    n = len(questions)
    return PuzzleArrays(
        inputs=(questions + 1).astype(np.uint8),
        labels=(answers + 1).astype(np.uint8),
        puzzle_identifiers=np.zeros(n, np.int32),
        puzzle_indices=np.arange(n + 1, dtype=np.int32),  # one example per puzzle
        group_indices=np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int32),
    )


def sudoku_split(questions: np.ndarray, answers: np.ndarray, group_sizes: np.ndarray):
    """One split in the upstream layout: (metadata, {"all": arrays}) for `write_dataset`.
    `group_sizes[i]` is how many rows (the puzzle and its augmentations) group i has."""
    arrays = _split_arrays(questions, answers, group_sizes)
    # Upstream writes total_puzzles = number of groups for Sudoku (not 1 + num_aug times it);
    # kept so dataset.json matches upstream's and step counts derived from it agree.
    meta = make_metadata(
        arrays,
        vocab_size=VOCAB_SIZE,
        pad_id=0,
        ignore_label_id=0,
        blank_identifier_id=0,
        num_puzzle_identifiers=1,
        total_puzzles=arrays.num_groups,
        mean_puzzle_examples=1.0,
    )
    return meta, {"all": arrays}


def _select(
    records: SudokuRecords,
    min_difficulty: float | None,
    subsample_size: int | None,
    rng: np.random.Generator,
) -> SudokuRecords:
    if min_difficulty is not None:
        records = records.take(np.flatnonzero(records.ratings >= min_difficulty))
    if subsample_size is not None and subsample_size < len(records):
        records = records.take(np.sort(rng.choice(len(records), subsample_size, replace=False)))
    return records


def build_sudoku(
    output_dir: str,
    train: SudokuRecords,
    test: SudokuRecords | None,
    *,
    subsample_size: int | None = None,
    test_subsample_size: int | None = None,
    min_difficulty: float | None = None,
    num_aug: int = 0,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = False,
    built_by: dict | None = None,
) -> dict:
    """Filter, subsample (train; test only if ``test_subsample_size``), augment (train), check and
    write ``output_dir``; returns a summary dict (counts, bytes, seconds)."""
    check_output_dir(output_dir, overwrite)
    t0 = time.perf_counter()
    splits = {}
    summary = {"output_dir": os.path.abspath(output_dir), "seed": seed, "num_aug": num_aug}
    for name, records, size, aug in (
        ("train", train, subsample_size, num_aug),
        ("test", test, test_subsample_size, 0),
    ):
        if records is None:
            continue
        rng = np.random.default_rng((seed, 0 if name == "train" else 1))
        records = _select(records, min_difficulty, size, rng)
        if len(records) == 0:
            raise ValueError(f"{name}: no puzzles left after --min-difficulty {min_difficulty}")
        check_sudoku_pairs(records.questions, records.answers, f"{records.origin} ({name}) ")
        qs, ans = [], []
        bar = tqdm(
            range(len(records)),
            desc=f"augment {name}",
            unit="group",
            disable=not (progress and aug > 0),
        )
        for g in bar:
            q, a = records.questions[g], records.answers[g]
            if aug:
                # One stream per group: the build is the same whatever order groups are made in.
                q, a = augment_sudoku(q, a, aug, np.random.default_rng((seed, 2, g)))
                check_sudoku_pairs(q, a, f"{name} group {g} augmentation ")
            else:
                q, a = q[None], a[None]
            qs.append(q)
            ans.append(a)
        questions, answers = np.concatenate(qs), np.concatenate(ans)
        splits[name] = sudoku_split(questions, answers, np.full(len(records), 1 + aug))
        arrays = splits[name][1]["all"]
        summary[name] = {
            "groups": arrays.num_groups,
            "examples": arrays.num_examples,
            "mean_givens": float((records.questions > 0).sum(1).mean()),
            "mean_rating": float(records.ratings.mean()),
        }
    write_dataset(output_dir, splits, ["<blank>"], overwrite=overwrite, built_by=built_by)
    summary["bytes"] = _dir_bytes(output_dir)
    summary["seconds"] = time.perf_counter() - t0
    return summary


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ------------------------------------------------------------------------------------------ CLI
def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m data.sudoku",
        description="Build a Sudoku data set in the upstream TRM on-disk layout.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Python API")[0],
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--csv-dir", help="directory with Sudoku-Extreme train.csv / test.csv")
    src.add_argument("--input-upstream", help="upstream-format Sudoku data set directory")
    src.add_argument("--generate", type=int, metavar="N", help="generate N train puzzles offline")
    p.add_argument(
        "--generate-test",
        type=int,
        default=None,
        metavar="M",
        help="test puzzles to generate (default with --generate: N // 5; with "
        "--input-upstream: used only when the input has no test split)",
    )
    p.add_argument(
        "--cache-dir", default=DEFAULT_CACHE, help="download cache (default: %(default)s)"
    )
    p.add_argument("--output-dir", required=True)
    p.add_argument(
        "--subsample-size", type=int, default=None, help="train puzzles to keep (random)"
    )
    p.add_argument(
        "--test-subsample-size",
        type=int,
        default=None,
        help="test puzzles to keep (default: all, as upstream)",
    )
    p.add_argument(
        "--min-difficulty",
        type=float,
        default=None,
        help="keep puzzles with rating >= this (CSV: its rating column; --generate: solver guesses, default 1)",
    )
    p.add_argument("--num-aug", type=int, default=0, help="augmentations per train puzzle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes for --generate (default: %(default)s)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


# options that change how the build runs, not what it writes (left out of its record)
_NEUTRAL = ("--overwrite", "--no-progress", "--workers", "--cache-dir")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    check_output_dir(args.output_dir, args.overwrite)  # before minutes of generating
    progress = not args.no_progress
    t0 = time.perf_counter()
    # Generated puzzles must need at least one guess unless asked otherwise: a minimal puzzle that
    # singles alone solve (~40% of them) teaches little.
    gen_min = 1 if args.min_difficulty is None else int(args.min_difficulty)
    csvs = []  # the Sudoku-Extreme CSVs read (a --csv-dir, or the download cache)
    if args.generate is not None:
        n_test = args.generate // 5 if args.generate_test is None else args.generate_test
        train, test = generated_splits(
            args.generate,
            n_test,
            args.seed,
            min_rating=gen_min,
            workers=args.workers,
            progress=progress,
        )
        min_difficulty = None  # already applied while generating
    elif args.input_upstream is not None:
        train = read_upstream_sudoku(args.input_upstream, "train")
        if os.path.isdir(os.path.join(args.input_upstream, "test")):
            test = read_upstream_sudoku(args.input_upstream, "test")
        elif args.generate_test:
            test = generate_records(
                args.generate_test,
                args.seed,
                start=1 << 30,
                workers=args.workers,
                progress=progress,
            )
        else:
            test = None
        min_difficulty = args.min_difficulty
    else:
        if args.csv_dir is not None:
            paths = [os.path.join(args.csv_dir, f"{s}.csv") for s in ("train", "test")]
            for path in paths:
                if not os.path.isfile(path):
                    raise SystemExit(
                        f"error: {path} not found (--csv-dir needs train.csv and test.csv)"
                    )
        else:
            try:
                paths = [
                    download_sudoku_csv(s, args.cache_dir, progress=progress)
                    for s in ("train", "test")
                ]
            except RuntimeError as e:
                raise SystemExit(f"error: {e}") from None
        train, test = (read_sudoku_csv(p, progress=progress) for p in paths)
        csvs = paths
        min_difficulty = args.min_difficulty
    read_s = time.perf_counter() - t0
    summary = build_sudoku(
        args.output_dir,
        train,
        test,
        subsample_size=args.subsample_size,
        test_subsample_size=args.test_subsample_size,
        min_difficulty=min_difficulty,
        num_aug=args.num_aug,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=progress,
        built_by=provenance.record(
            "data.sudoku",
            provenance.command_args(argv, neutral=_NEUTRAL),
            {"input_upstream": args.input_upstream, **dict(zip(("train_csv", "test_csv"), csvs))},
        ),
    )
    summary["source_seconds"] = read_s
    _print_summary(summary)
    return summary


def _print_summary(s: dict) -> None:
    print(
        f"wrote {s['output_dir']}  ({s['bytes'] / 1e6:.1f} MB, seed {s['seed']}, num_aug {s['num_aug']})"
    )
    for name in ("train", "test"):
        if name in s:
            t = s[name]
            print(
                f"  {name:5s}: {t['groups']:>9,d} groups  {t['examples']:>11,d} examples  "
                f"mean givens {t['mean_givens']:.1f}  mean rating {t['mean_rating']:.1f}"
            )
        else:
            print(f"  {name:5s}: (none: the source has no {name} split)")
    print(
        f"  time : {s['source_seconds']:.1f} s reading/generating + {s['seconds']:.1f} s building"
    )


if __name__ == "__main__":
    cli.run(main)
