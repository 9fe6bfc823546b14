"""TRM data-side golden fixtures: upstream's ARC evaluator (evaluators/arc.py) on synthetic
predictions, and the batches upstream's PuzzleDataset (puzzle_dataset.py) yields from a small data
set our own builder wrote (data.sudoku_easy, upstream's on-disk layout).

- OUT/trm_arc_eval.npz + .json: two evaluation batches (inputs, puzzle_identifiers, preds,
  q_halt_logits; padding rows with the blank id), the identifiers and test puzzles, and what
  upstream's ARC.result() returned (pass@K) and wrote (submission.json). Three tasks: one test
  input; two test inputs; one test input that no row predicts. Each row is one augmentation
  (dihedral transform + colour map, named `<id>|||t<k>|||<map>`) predicting the true output, a
  wrong grid, or a grid cut short by a stray token, so votes are split and pass@1 != pass@2.
- OUT/trm_puzzle_dataset.npz + .json: the data set's files (every .npy and .json), and the test
  batches (global batch 4, one process and rank 0/1 of two) and one iteration of train batches
  (global batch 4, 2 epochs per iteration, seed 0, np.random seeded 0) upstream yielded.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

# imported here, before upstream's checkout hides this repository's root (parity.goldens.trm)
from data.arc import aug_name, grid_to_seq
from data.augment import dihedral_transform
from data.sudoku_easy import build_easy_sudoku
from parity.goldens.common import save_npz

ARC_SEED = 5
PASS_KS = (1, 2, 5, 10, 100, 1000)


def _grid(rng, h=None, w=None):
    h = h or int(rng.integers(2, 6))
    w = w or int(rng.integers(2, 7))
    return rng.integers(0, 10, (h, w)).astype(np.uint8)


def arc_case(seed: int = ARC_SEED):
    """(identifiers, test_puzzles, rows): rows = list of (pid, input seq, pred seq, q)."""
    rng = np.random.default_rng(seed)
    tasks = {
        "a0000001": 1,
        "b0000002": 2,
        "c0000003": 1,  # no row predicts it
    }
    test_puzzles, identifiers, rows = {}, ["<blank>"], []
    for task_id, n_test in tasks.items():
        pairs = [(_grid(rng), _grid(rng)) for _ in range(n_test)]
        test_puzzles[task_id] = {
            "train": [{"input": _grid(rng).tolist(), "output": _grid(rng).tolist()}],
            "test": [{"input": a.tolist(), "output": b.tolist()} for a, b in pairs],
        }
        if task_id.startswith("c"):
            identifiers.append(aug_name(task_id, 0, np.arange(10, dtype=np.uint8)))
            continue
        augs = [(0, np.arange(10, dtype=np.uint8))] + [
            (int(rng.integers(1, 8)), rng.permutation(10).astype(np.uint8)) for _ in range(4)
        ]
        for tid, perm in augs:
            pid = len(identifiers)
            identifiers.append(aug_name(task_id, tid, perm))
            for j, (inp, out) in enumerate(pairs):
                wrong = out.copy()
                wrong[0, 0] = (wrong[0, 0] + 1) % 10
                # input 0 of task a: the wrong grid wins the vote on count, the right one is 2nd
                p_right = 0.35 if (task_id.startswith("a") and j == 0) else 0.6
                choice = rng.random()
                cand = out if choice < p_right else wrong
                seq_in = grid_to_seq(dihedral_transform(perm[inp], tid))
                seq_pred = grid_to_seq(dihedral_transform(perm[cand], tid))
                if rng.random() < 0.15:  # a stray PAD inside the grid: the crop gets smaller
                    g = seq_pred.reshape(30, 30).copy()
                    g[1, 1] = 0
                    seq_pred = g.reshape(-1)
                rows.append((pid, seq_in, seq_pred, float(rng.normal(0, 2))))
    order = rng.permutation(len(rows))
    return identifiers, test_puzzles, [rows[i] for i in order]


def arc_batches(rows, batch_size: int = 8):
    """Rows into batches of `batch_size`, the last padded with blank rows (id 0, all PAD)."""
    batches = []
    for s in range(0, len(rows), batch_size):
        chunk = rows[s : s + batch_size]
        pad = batch_size - len(chunk)
        pids = np.array([r[0] for r in chunk] + [0] * pad, np.int32)
        inputs = np.stack([r[1] for r in chunk] + [np.zeros(900, np.uint8)] * pad).astype(np.int32)
        preds = np.stack([r[2] for r in chunk] + [np.zeros(900, np.uint8)] * pad).astype(np.int32)
        q = np.array([r[3] for r in chunk] + [0.0] * pad, np.float32)
        batches.append(
            {"inputs": inputs, "puzzle_identifiers": pids, "preds": preds, "q_halt_logits": q}
        )
    return batches


def generate_arc_eval(imp, out: Path) -> list[str]:
    import torch
    import torch.distributed as dist

    identifiers, test_puzzles, rows = arc_case()
    batches = arc_batches(rows)
    arc_mod = imp("evaluators.arc")
    common = imp("dataset.common")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "identifiers.json").write_text(json.dumps(identifiers))
        (Path(tmp) / "test_puzzles.json").write_text(json.dumps(test_puzzles))
        meta = common.PuzzleDatasetMetadata(
            pad_id=0,
            ignore_label_id=0,
            blank_identifier_id=0,
            vocab_size=12,
            seq_len=900,
            num_puzzle_identifiers=len(identifiers),
            total_groups=len(test_puzzles),
            mean_puzzle_examples=1.0,
            total_puzzles=len(test_puzzles),
            sets=["all"],
        )
        ev = arc_mod.ARC(tmp, meta, submission_K=2, pass_Ks=PASS_KS, aggregated_voting=True)
        ev.begin_eval()
        for b in batches:
            t = {k: torch.from_numpy(v) for k, v in b.items()}
            ev.update_batch(
                {"inputs": t["inputs"], "puzzle_identifiers": t["puzzle_identifiers"]},
                {"preds": t["preds"], "q_halt_logits": t["q_halt_logits"]},
            )
        # result() gathers with torch.distributed even for one process: a one-process gloo group
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            metrics = ev.result(tmp, rank=0, world_size=1)
        finally:
            dist.destroy_process_group()
        submission = json.loads((Path(tmp) / "submission.json").read_text())
    arrays = {f"batch{i}.{k}": v for i, b in enumerate(batches) for k, v in b.items()}
    save_npz(out, "trm_arc_eval", arrays)
    (out / "trm_arc_eval.json").write_text(
        json.dumps(
            {
                "identifiers": identifiers,
                "test_puzzles": test_puzzles,
                "pass_Ks": list(PASS_KS),
                "submission_K": 2,
                "batches": len(batches),
                "metrics": metrics,
                "submission": submission,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    return ["trm_arc_eval.npz", "trm_arc_eval.json"]


DATASET_BUILD = dict(train=6, test=5, blanks=8, num_aug=1, seed=0, unique=0)
BATCH = 4
EPOCHS_PER_ITER = 2


def dataset_files(root: Path) -> tuple[dict, dict]:
    """(arrays, jsons) of every file of a data set directory, keyed by relative path."""
    arrays, jsons = {}, {}
    for dirpath, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if f.endswith(".npy"):
                arrays[rel] = np.load(os.path.join(dirpath, f))
            elif f.endswith(".json"):
                jsons[rel] = json.loads(Path(dirpath, f).read_text())
    return arrays, jsons


def write_dataset_files(root: Path, arrays: dict, jsons: dict) -> Path:
    for rel, v in arrays.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / rel, v)
    for rel, v in jsons.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(v))
    return root


def generate_puzzle_dataset(imp, out: Path) -> list[str]:
    pd = imp("puzzle_dataset")
    with tempfile.TemporaryDirectory() as tmp:
        build_easy_sudoku(tmp, **DATASET_BUILD)
        files, jsons = dataset_files(Path(tmp))
        got = {}

        def run(split, test_mode, rank, replicas, prefix):
            cfg = pd.PuzzleDatasetConfig(
                seed=0,
                dataset_paths=[tmp],
                global_batch_size=BATCH,
                test_set_mode=test_mode,
                epochs_per_iter=EPOCHS_PER_ITER,
                rank=rank,
                num_replicas=replicas,
            )
            n = 0
            for n, (set_name, batch, effective) in enumerate(pd.PuzzleDataset(cfg, split)):
                assert set_name == "all"
                for k, v in batch.items():
                    got[f"{prefix}.{n}.{k}"] = v.numpy()
                got[f"{prefix}.{n}.effective"] = np.int64(effective)
            got[f"{prefix}.batches"] = np.int64(n + 1)

        run("test", True, 0, 1, "test")
        run("test", True, 0, 2, "test_rank0of2")
        run("test", True, 1, 2, "test_rank1of2")
        # upstream draws the example order from the global numpy RNG: seed it, put it back after
        state = np.random.get_state()  # noqa: NPY002
        np.random.seed(0)  # noqa: NPY002
        try:
            run("train", False, 0, 1, "train")
        finally:
            np.random.set_state(state)  # noqa: NPY002
    arrays = {f"file.{k}": v for k, v in files.items()}
    arrays.update(got)
    save_npz(out, "trm_puzzle_dataset", arrays)
    (out / "trm_puzzle_dataset.json").write_text(
        json.dumps(
            {
                "build": {"builder": "data.sudoku_easy.build_easy_sudoku", **DATASET_BUILD},
                "global_batch_size": BATCH,
                "epochs_per_iter": EPOCHS_PER_ITER,
                "seed": 0,
                "numpy_global_seed": 0,
                "files": jsons,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    return ["trm_puzzle_dataset.npz", "trm_puzzle_dataset.json"]
