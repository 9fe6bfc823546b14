"""ARC-AGI (1 and 2, plus ConceptARC) in the upstream TRM puzzle layout.

    python -m data.arc --input-file-prefix kaggle/combined/arc-agi --output-dir data_out/arc1 \\
        --subsets training evaluation concept --test-set-name evaluation          # ARC-AGI-1
    python -m data.arc --download --output-dir data_out/arc2 \\
        --subsets training2 evaluation2 concept --test-set-name evaluation2       # ARC-AGI-2

Inputs (Kaggle layout): `<prefix>_<subset>_challenges.json` ({task id: {"train": [{input, output}],
"test": [{input}]}}) and `<prefix>_<subset>_solutions.json` ({task id: [output per test input]}).
`--download` fetches the combined files from the upstream TRM repository into a cache folder. A
missing solutions file (Kaggle's hidden test set) is filled with [[0]] outputs, with a warning.

Split rule (upstream): demonstration pairs of every task go to TRAIN; the test pairs of tasks in
`--test-set-name` go to TEST, those of every other subset to TRAIN. So the evaluation tasks'
demonstrations are trained on (test-time training folded into pretraining).

Augmentation: per task, up to 5 * num_aug random draws of (dihedral id 0..7, permutation of
colours 1..9 with 0 fixed) until num_aug distinct augmented tasks are found (distinct = different
sha256 over the multiset of its (input, output) pairs, the original included). Augmented task name:
`<id>|||t<k>|||<colour map>` (colour map: 10 digits, digit c = new colour of old colour c).
Every name gets its own puzzle identifier, from 1; 0 is "<blank>". A task and its augmentations
form one group in each split it appears in.

Encoding: 30x30 canvas, PAD 0, EOS 1, colour c -> c + 2 (vocab 12, seq_len 900). The grid sits at a
top-left offset (same for the input and output of a pair) followed by an EOS row below it (over the
grid's columns) and an EOS column right of it (over its rows) when they fit in 30. Offsets are
random only for TRAIN examples, and one example per train puzzle stays at (0, 0).
ignore_label_id 0: PAD in labels is not supervised; EOS is.

Also writes identifiers.json and test_puzzles.json ({task id: {"train": [...], "test": [{input,
output}]}} for the test subset, read by data.arc_eval). Seeded (--seed, default 42 as upstream)
but not byte-identical to upstream's build, whose random draws come from numpy's global RNG.

API
  GRID, SEQ_LEN, VOCAB_SIZE, PAD, EOS, COLOUR_OFFSET
  load_subsets(prefix, subsets) -> {subset: {task id: task}}
  grid_to_seq(grid, offset=(0, 0)) -> uint8 [900]; augment_task(task, tid, perm)
  parse_name(name) -> (task id, tid, perm)          (tid 0 / identity perm for plain ids)
  grid_hash(grid) -> str
  build(output_dir, *, input_file_prefix=None, subsets=..., test_set_name=..., num_aug=1000,
        seed=42, overwrite=False, download=False) -> dict
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data import cli, provenance
from data.augment import (
    colour_map_from_str,
    colour_map_to_str,
    dihedral_transform,
    random_colour_permutation,
)
from data.download import fetch
from data.puzzle_format import PuzzleArrays, check_output_dir, make_metadata, write_dataset

GRID = 30
SEQ_LEN = GRID * GRID
PAD, EOS, COLOUR_OFFSET = 0, 1, 2
VOCAB_SIZE = 10 + COLOUR_OFFSET
AUG_RETRIES_FACTOR = 5
NAME_SEP = "|||"
DEFAULT_SUBSETS = ("training", "evaluation", "concept")
UPSTREAM_URL = (
    "https://raw.githubusercontent.com/SamsungSAILMontreal/TinyRecursiveModels/main/"
    "kaggle/combined/arc-agi_{subset}_{kind}.json"
)


class ARCFormatError(ValueError):
    """A Kaggle-layout ARC file that does not hold what the builder expects."""


# ---------------------------------------------------------------------------------------------
# reading


def _grid(obj, where: str) -> np.ndarray:
    try:
        g = np.array(obj, dtype=np.int64)
    except (ValueError, TypeError) as e:
        raise ARCFormatError(f"{where}: not a rectangular grid ({e})") from e
    if g.ndim != 2 or not (1 <= g.shape[0] <= GRID and 1 <= g.shape[1] <= GRID):
        raise ARCFormatError(f"{where}: grid shape {g.shape}, expected 2-D within 1..{GRID}")
    if g.min() < 0 or g.max() > 9:
        raise ARCFormatError(f"{where}: colours must be 0..9, got [{g.min()}, {g.max()}]")
    return g.astype(np.uint8)


def load_subsets(prefix, subsets) -> dict[str, dict[str, dict]]:
    """{subset: {task id: {"train": [(in, out)], "test": [(in, out)]}}} with solutions merged in."""
    out = {}
    for subset in subsets:
        files = {k: Path(f"{prefix}_{subset}_{k}.json") for k in ("challenges", "solutions")}
        if not files["challenges"].is_file():
            raise FileNotFoundError(
                f"{files['challenges']} not found (expected Kaggle layout "
                f"<prefix>_<subset>_{{challenges,solutions}}.json; subset {subset!r})"
            )
        challenges = json.loads(files["challenges"].read_text())
        if files["solutions"].is_file():
            solutions = json.loads(files["solutions"].read_text())
        else:  # e.g. Kaggle's hidden test challenges: build for a submission, scores meaningless
            warnings.warn(
                f"{files['solutions']} not found: test outputs filled with [[0]]", stacklevel=2
            )
            solutions = {t: [[[0]]] * len(task["test"]) for t, task in challenges.items()}
        tasks = {}
        for tid_, task in challenges.items():
            where = f"{files['challenges']}[{tid_}]"
            if tid_ not in solutions:
                raise ARCFormatError(f"{files['solutions']}: no solutions for task {tid_}")
            if len(solutions[tid_]) != len(task["test"]):
                raise ARCFormatError(
                    f"{files['solutions']}[{tid_}]: {len(solutions[tid_])} outputs for "
                    f"{len(task['test'])} test inputs"
                )
            tasks[tid_] = {
                "train": [
                    (
                        _grid(p["input"], f"{where}.train[{i}].input"),
                        _grid(p["output"], f"{where}.train[{i}].output"),
                    )
                    for i, p in enumerate(task["train"])
                ],
                "test": [
                    (
                        _grid(p["input"], f"{where}.test[{i}].input"),
                        _grid(sol, f"{files['solutions']}[{tid_}][{i}]"),
                    )
                    for i, (p, sol) in enumerate(zip(task["test"], solutions[tid_]))
                ],
            }
        out[subset] = tasks
    return out


def download(subsets, cache_dir) -> str:
    """Fetch the Kaggle-layout files from the upstream repository; returns the file prefix."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for subset in subsets:
        for kind in ("challenges", "solutions"):
            dest = cache_dir / f"arc-agi_{subset}_{kind}.json"
            if dest.exists():
                continue
            url = UPSTREAM_URL.format(subset=subset, kind=kind)
            fetch(url, dest, offline_hint="pass --input-file-prefix")
    return str(cache_dir / "arc-agi")


# ---------------------------------------------------------------------------------------------
# encoding and augmentation


def grid_to_seq(grid: np.ndarray, offset: tuple[int, int] = (0, 0)) -> np.ndarray:
    """Place `grid` (colours 0..9) at `offset` on the 30x30 canvas with its EOS borders."""
    r0, c0 = offset
    h, w = grid.shape
    canvas = np.full((GRID, GRID), PAD, dtype=np.uint8)
    canvas[r0 : r0 + h, c0 : c0 + w] = grid + COLOUR_OFFSET
    if r0 + h < GRID:
        canvas[r0 + h, c0 : c0 + w] = EOS
    if c0 + w < GRID:
        canvas[r0 : r0 + h, c0 + w] = EOS
    return canvas.reshape(SEQ_LEN)


def grid_hash(grid: np.ndarray) -> str:
    g = np.ascontiguousarray(grid, dtype=np.uint8)
    return hashlib.sha256(np.array(g.shape, np.int64).tobytes() + g.tobytes()).hexdigest()


def _task_hash(pairs) -> str:
    # The multiset of pairs: order of demonstrations does not make a task different.
    keys = sorted(grid_hash(a) + grid_hash(b) for a, b in pairs)
    return hashlib.sha256("".join(keys).encode()).hexdigest()


def augment_task(task: dict, tid: int, perm: np.ndarray) -> dict:
    return {
        split: [
            (dihedral_transform(perm[a], tid), dihedral_transform(perm[b], tid)) for a, b in pairs
        ]
        for split, pairs in task.items()
    }


def aug_name(task_id: str, tid: int, perm: np.ndarray) -> str:
    return f"{task_id}{NAME_SEP}t{tid}{NAME_SEP}{colour_map_to_str(perm)}"


def parse_name(name: str) -> tuple[str, int, np.ndarray]:
    parts = name.split(NAME_SEP)
    if len(parts) == 1:
        return name, 0, np.arange(10, dtype=np.uint8)
    if len(parts) != 3 or not parts[1].startswith("t") or not parts[1][1:].isdigit():
        raise ValueError(f"puzzle name {name!r} is not '<id>|||t<k>|||<colour map>'")
    return parts[0], int(parts[1][1:]), colour_map_from_str(parts[2])


def _augmentations(
    task_id: str, task: dict, num_aug: int, rng
) -> list[tuple[str, int, np.ndarray]]:
    """(name, dihedral id, colour map) of the task itself followed by up to num_aug distinct
    augmentations."""
    identity = np.arange(10, dtype=np.uint8)
    versions = [(task_id, 0, identity)]
    if num_aug <= 0:
        return versions
    seen = {_task_hash(task["train"] + task["test"])}
    for _ in range(AUG_RETRIES_FACTOR * num_aug):
        tid = int(rng.integers(0, 8))
        perm = random_colour_permutation(rng)
        new = augment_task(task, tid, perm)
        h = _task_hash(new["train"] + new["test"])
        if h in seen:
            continue
        seen.add(h)
        versions.append((aug_name(task_id, tid, perm), tid, perm))
        if len(versions) == num_aug + 1:
            break
    return versions


# ---------------------------------------------------------------------------------------------
# build


class _SplitWriter:
    """Fills one split's preallocated arrays group by group (the full num_aug=1000 ARC-AGI-1 build
    is ~4M examples, 3.6 GB per token array: no lists of rows, no concatenation copies)."""

    def __init__(self, num_examples: int, num_puzzles: int, num_groups: int):
        self.inputs = np.zeros((num_examples, SEQ_LEN), np.uint8)
        self.labels = np.zeros((num_examples, SEQ_LEN), np.uint8)
        self.ids = np.zeros(num_puzzles, np.int32)
        self.puzzle_indices = np.zeros(num_puzzles + 1, np.int32)
        self.group_indices = np.zeros(num_groups + 1, np.int32)
        self.n_ex = self.n_pz = self.n_gr = 0

    def add_group(self, puzzles, translate: bool, rng) -> None:
        for pid, pairs in puzzles:
            keep_at_origin = int(rng.integers(0, len(pairs))) if translate else -1
            for i, (a, b) in enumerate(pairs):
                offset = (0, 0)
                if translate and i != keep_at_origin:
                    offset = (
                        int(rng.integers(0, GRID - max(a.shape[0], b.shape[0]) + 1)),
                        int(rng.integers(0, GRID - max(a.shape[1], b.shape[1]) + 1)),
                    )
                self.inputs[self.n_ex] = grid_to_seq(a, offset)
                self.labels[self.n_ex] = grid_to_seq(b, offset)
                self.n_ex += 1
            self.ids[self.n_pz] = pid
            self.n_pz += 1
            self.puzzle_indices[self.n_pz] = self.n_ex
        self.n_gr += 1
        self.group_indices[self.n_gr] = self.n_pz

    def arrays(self) -> PuzzleArrays:
        if (self.n_ex, self.n_pz, self.n_gr + 1) != (
            len(self.inputs),
            len(self.ids),
            len(self.group_indices),
        ):
            raise AssertionError("ARC builder: counted and written sizes differ")
        return PuzzleArrays(
            self.inputs, self.labels, self.ids, self.puzzle_indices, self.group_indices
        )


def build(
    output_dir,
    *,
    input_file_prefix=None,
    subsets=DEFAULT_SUBSETS,
    test_set_name: str = "evaluation",
    num_aug: int = 1000,
    seed: int = 42,
    overwrite: bool = False,
    download_to=None,
    built_by: dict | None = None,
) -> dict:
    t0 = time.time()
    output_dir = Path(output_dir)
    check_output_dir(output_dir, overwrite)
    if test_set_name not in subsets:
        raise ValueError(
            f"--test-set-name {test_set_name!r} is not one of --subsets {list(subsets)}"
        )
    if input_file_prefix is None:
        input_file_prefix = download(subsets, download_to or output_dir.parent / ".arc_download")
    data = load_subsets(input_file_prefix, subsets)
    rng = np.random.default_rng(seed)
    # ARC-AGI-2's training2 holds 376 of ARC-AGI-1's evaluation task ids (356 with the same test
    # pairs): mixing the two leaks the answers into training. Upstream does not check.
    leaked = sorted(
        {t for s, tasks in data.items() if s != test_set_name for t in tasks}
        & set(data[test_set_name])
    )
    if leaked:
        warnings.warn(
            f"{len(leaked)} task ids of test set {test_set_name!r} also appear in other subsets "
            f"(e.g. {leaked[:3]}); their test pairs are trained on through those subsets",
            stacklevel=2,
        )

    names = ["<blank>"]
    ident: dict[str, int] = {}

    def identifier(name: str) -> int:
        if name not in ident:
            ident[name] = len(names)
            names.append(name)
        return ident[name]

    # Pass 1 draws every augmentation (kept as (name, dihedral id, colour map), not grids) so the
    # split sizes are known; pass 2 re-applies them straight into preallocated arrays.
    plan = []  # (subset, task id, [(puzzle id, tid, perm)])
    counts = {"train": np.zeros(3, np.int64), "test": np.zeros(3, np.int64)}  # ex, puzzles, groups
    test_puzzles = {}
    for subset, tasks in data.items():
        for task_id, task in tqdm(tasks.items(), desc=f"augment {subset} (num_aug={num_aug})"):
            versions = [
                (identifier(n), t, p) for n, t, p in _augmentations(task_id, task, num_aug, rng)
            ]
            plan.append((subset, task_id, versions))
            is_test = subset == test_set_name
            n_train = len(task["train"]) + (0 if is_test else len(task["test"]))
            counts["train"] += (n_train * len(versions), len(versions), 1)
            if is_test:
                counts["test"] += (len(task["test"]) * len(versions), len(versions), 1)
                if task_id in test_puzzles:
                    raise ARCFormatError(f"task id {task_id} appears twice in {test_set_name}")
                test_puzzles[task_id] = {
                    split: [{"input": a.tolist(), "output": b.tolist()} for a, b in task[split]]
                    for split in ("train", "test")
                }
    writers = {split: _SplitWriter(*map(int, c)) for split, c in counts.items()}
    for subset, task_id, versions in tqdm(plan, desc="encode"):
        task = data[subset][task_id]
        train_group, test_group = [], []
        for pid, tid, perm in versions:
            v = augment_task(task, tid, perm)
            if subset == test_set_name:
                train_group.append((pid, v["train"]))
                test_group.append((pid, v["test"]))
            else:
                train_group.append((pid, v["train"] + v["test"]))
        writers["train"].add_group(train_group, translate=True, rng=rng)
        if test_group:
            writers["test"].add_group(test_group, translate=False, rng=rng)

    splits, summary = {}, {"input_file_prefix": str(input_file_prefix), "num_aug": num_aug}
    summary["test_ids_in_other_subsets"] = len(leaked)
    for split, w in writers.items():
        arrays = w.arrays()
        meta = make_metadata(arrays, vocab_size=VOCAB_SIZE, num_puzzle_identifiers=len(names))
        splits[split] = (meta, {"all": arrays})
        summary[f"{split}_groups"] = arrays.num_groups
        summary[f"{split}_puzzles"] = arrays.num_puzzles
        summary[f"{split}_examples"] = arrays.num_examples
        summary[f"{split}_mean_puzzle_examples"] = round(meta.mean_puzzle_examples, 4)
    write_dataset(
        output_dir,
        splits,
        names,
        extra_json={"test_puzzles": test_puzzles},
        overwrite=overwrite,
        built_by=built_by,
    )
    summary["num_puzzle_identifiers"] = len(names)
    summary["bytes"] = sum(f.stat().st_size for f in output_dir.rglob("*") if f.is_file())
    summary["seconds"] = round(time.time() - t0, 2)
    return summary


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = cli.parser("data.arc", __doc__)
    p.add_argument(
        "--input-file-prefix",
        default=None,
        help="e.g. kaggle/combined/arc-agi (files <prefix>_<subset>_challenges.json)",
    )
    p.add_argument(
        "--download",
        action="store_true",
        help="fetch the Kaggle-layout files from the upstream TRM repository",
    )
    p.add_argument("--download-dir", default=None)
    p.add_argument("--output-dir", default="data_out/arc1concept-aug-1000")
    p.add_argument("--subsets", nargs="+", default=list(DEFAULT_SUBSETS))
    p.add_argument("--test-set-name", default="evaluation")
    p.add_argument("--num-aug", type=int, default=1000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    if (args.input_file_prefix is None) == (not args.download):
        p.error("give exactly one of --input-file-prefix or --download")
    summary = build(
        args.output_dir,
        input_file_prefix=args.input_file_prefix,
        subsets=args.subsets,
        test_set_name=args.test_set_name,
        num_aug=args.num_aug,
        seed=args.seed,
        overwrite=args.overwrite,
        download_to=args.download_dir,
        built_by=provenance.record(
            "data.arc",
            provenance.command_args(argv, neutral=("--overwrite", "--download-dir")),
            {"input_file_prefix": args.input_file_prefix},
        ),
    )
    return cli.print_summary(summary)


if __name__ == "__main__":
    cli.run(main)
