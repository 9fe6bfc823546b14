"""ARC builder, augmentations and evaluator, on small synthetic ARC tasks (synthetic_tasks); one
test builds the real ARC-AGI-1 subsets from ../shared/data and checks upstream's counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data import arc, arc_eval
from data.augment import (
    DIHEDRAL_INVERSE,
    colour_map_from_str,
    colour_map_to_str,
    dihedral_transform,
    inverse_dihedral_transform,
    invert_permutation,
    random_colour_permutation,
)
from data.puzzle_format import IGNORE_LABEL, load_split
from data.puzzle_source import PuzzleTestDataset

TRAIN_TASKS, EVAL_TASKS = 4, 3
NUM_AUG = 3


def synthetic_tasks(n: int, seed: int, *, prefix: str, two_tests: bool = False):
    """`n` made-up ARC tasks as Kaggle-layout (challenges, solutions) dicts.

    Each task has one rule: a dihedral transform of the grid, then every colour c -> (c + k) % 10
    with k in 1..9, so no output equals its input. Grids are 2-9 cells a side with random colours
    (0 included), 2-4 demonstrations and one test input (two in the first task if `two_tests`)."""
    rng = np.random.default_rng(seed)
    challenges, solutions = {}, {}
    for t in range(n):
        tid, k = int(rng.integers(8)), int(rng.integers(1, 10))

        def pair(tid=tid, k=k):
            g = rng.integers(0, 10, size=tuple(rng.integers(2, 10, size=2)))
            return g.tolist(), ((dihedral_transform(g, tid) + k) % 10).tolist()

        demos = [pair() for _ in range(int(rng.integers(2, 5)))]
        tests = [pair() for _ in range(2 if two_tests and t == 0 else 1)]
        name = f"{prefix}{t:04x}"
        challenges[name] = {
            "train": [{"input": i, "output": o} for i, o in demos],
            "test": [{"input": i} for i, _ in tests],
        }
        solutions[name] = [o for _, o in tests]
    return challenges, solutions


@pytest.fixture(scope="module")
def kaggle_prefix(tmp_path_factory):
    """A small Kaggle-layout folder of synthetic tasks (synthetic_tasks): 'training' and
    'evaluation', whose first task has two test inputs."""
    root = tmp_path_factory.mktemp("kaggle")
    for subset, n, seed in (("training", TRAIN_TASKS, 0), ("evaluation", EVAL_TASKS, 1)):
        ch, so = synthetic_tasks(
            n, seed, prefix=f"{subset[:2]}00", two_tests=subset == "evaluation"
        )
        (root / f"arc-agi_{subset}_challenges.json").write_text(json.dumps(ch))
        (root / f"arc-agi_{subset}_solutions.json").write_text(json.dumps(so))
    return str(root / "arc-agi")


@pytest.fixture(scope="module")
def built(kaggle_prefix, tmp_path_factory):
    out = tmp_path_factory.mktemp("arc") / "ds"
    summary = arc.main(
        [
            "--input-file-prefix",
            kaggle_prefix,
            "--output-dir",
            str(out),
            "--num-aug",
            str(NUM_AUG),
            "--subsets",
            "training",
            "evaluation",
            "--test-set-name",
            "evaluation",
        ]
    )
    return out, summary


# ---------------------------------------------------------------------------------------------
# augmentations


def test_dihedral_ids_inverses_and_colour_maps():
    a = np.arange(12).reshape(3, 4)  # non-square: catches swapped axes
    outs = [dihedral_transform(a, t) for t in range(8)]
    assert len({(o.shape, o.tobytes()) for o in outs}) == 8  # the 8 elements are distinct
    reference = [
        a,
        np.rot90(a, 1),
        np.rot90(a, 2),
        np.rot90(a, 3),
        np.fliplr(a),
        np.flipud(a),
        a.T,
        np.fliplr(np.rot90(a, 1)),
    ]  # upstream's definitions by id
    for t in range(8):
        np.testing.assert_array_equal(outs[t], reference[t])
    np.testing.assert_array_equal(dihedral_transform(np.stack([a, a + 1]), 1)[1], np.rot90(a + 1))
    np.testing.assert_array_equal(outs[6], a.T)
    np.testing.assert_array_equal(outs[7], a[::-1, ::-1].T)  # anti-transpose
    for t in range(8):
        np.testing.assert_array_equal(inverse_dihedral_transform(outs[t], t), a)
        back = dihedral_transform(outs[t], DIHEDRAL_INVERSE[t])
        np.testing.assert_array_equal(back, a)
    assert list(DIHEDRAL_INVERSE) == [0, 3, 2, 1, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="0..7"):
        dihedral_transform(a, 8)

    rng = np.random.default_rng(0)
    perm = random_colour_permutation(rng)
    assert perm[0] == 0 and sorted(perm) == list(range(10))
    inv = invert_permutation(perm)
    np.testing.assert_array_equal(inv[perm], np.arange(10))
    np.testing.assert_array_equal(colour_map_from_str(colour_map_to_str(perm)), perm)
    with pytest.raises(ValueError, match="not a permutation"):
        colour_map_from_str("0123456788")


# ---------------------------------------------------------------------------------------------
# builder


def _origin_grid(seq):
    return arc_eval.crop(seq)


def test_split_rule_encoding_and_names(built, kaggle_prefix):
    out, summary = built
    tasks = arc.load_subsets(kaggle_prefix, ["training", "evaluation"])
    names = json.loads((out / "identifiers.json").read_text())
    assert names[0] == "<blank>" and len(set(names)) == len(names)
    train = load_split(out, "train", raw=True)
    test = load_split(out, "test", raw=True)
    meta = train.metadata
    assert (meta.vocab_size, meta.seq_len, meta.pad_id, meta.ignore_label_id) == (12, 900, 0, 0)
    assert meta.num_puzzle_identifiers == len(names) == summary["num_puzzle_identifiers"]
    assert train.all.num_groups == TRAIN_TASKS + EVAL_TASKS and test.all.num_groups == EVAL_TASKS

    def puzzles(split):
        a = split.all
        for p in range(a.num_puzzles):
            lo, hi = a.puzzle_indices[p], a.puzzle_indices[p + 1]
            yield names[a.puzzle_identifiers[p]], a.inputs[lo:hi], a.labels[lo:hi]

    seen_test = set()
    for name, x, y in puzzles(test):  # test pairs of the test subset only, at the origin
        task_id, tid, perm = arc.parse_name(name)
        assert task_id in tasks["evaluation"]
        pairs = tasks["evaluation"][task_id]["test"]
        assert len(x) == len(pairs)
        for (gi, go), xi, yi in zip(pairs, x, y):
            inv = invert_permutation(perm)
            np.testing.assert_array_equal(
                inv[inverse_dihedral_transform(_origin_grid(xi), tid)], gi
            )
            np.testing.assert_array_equal(
                inv[inverse_dihedral_transform(_origin_grid(yi), tid)], go
            )
            np.testing.assert_array_equal(yi, arc.grid_to_seq(dihedral_transform(perm[go], tid)))
        seen_test.add(name)
    assert len(seen_test) == EVAL_TASKS * (NUM_AUG + 1)

    for name, x, _y in puzzles(train):
        task_id, tid, perm = arc.parse_name(name)
        subset = "training" if task_id in tasks["training"] else "evaluation"
        task = tasks[subset][task_id]
        # Demonstrations always train; test pairs train only outside the test subset.
        want = len(task["train"]) + (len(task["test"]) if subset == "training" else 0)
        assert len(x) == want, name
        g = x.reshape(-1, 30, 30)
        assert (g[:, 0, 0] >= 2).sum() >= 1  # one example per puzzle left at the origin
        assert set(np.unique(x)) <= set(range(12))
    assert (np.asarray(train.all.inputs).reshape(-1, 30, 30)[:, 0, 0] < 2).any()  # translated

    tp = json.loads((out / "test_puzzles.json").read_text())
    assert sorted(tp) == sorted(tasks["evaluation"])
    for task_id, t in tp.items():
        for pair, (_gi, go) in zip(t["test"], tasks["evaluation"][task_id]["test"]):
            np.testing.assert_array_equal(np.array(pair["output"]), go)


def test_grid_to_seq_eos_borders():
    g = np.array([[1, 2, 3], [4, 5, 6]], np.uint8)
    c = arc.grid_to_seq(g, (3, 4)).reshape(30, 30)
    np.testing.assert_array_equal(c[3:5, 4:7], g + 2)
    np.testing.assert_array_equal(c[5, 4:7], [1, 1, 1])  # EOS row under the grid's columns
    np.testing.assert_array_equal(c[3:5, 7], [1, 1])  # EOS column right of its rows
    assert c[5, 7] == 0 and (c != 0).sum() == 6 + 3 + 2
    full = arc.grid_to_seq(np.zeros((30, 30), np.uint8))
    assert (full == 2).all()  # a 30x30 grid has no room for EOS
    np.testing.assert_array_equal(arc_eval.crop(arc.grid_to_seq(g)), g)


def test_build_is_seeded(built, kaggle_prefix, tmp_path):
    out, _ = built
    args = dict(
        input_file_prefix=kaggle_prefix,
        subsets=["training", "evaluation"],
        test_set_name="evaluation",
        num_aug=NUM_AUG,
    )
    arc.build(tmp_path / "same", seed=42, **args)
    arc.build(tmp_path / "other", seed=1, **args)
    a, b, c = (
        load_split(p, "train", raw=True).all for p in (out, tmp_path / "same", tmp_path / "other")
    )
    np.testing.assert_array_equal(a.inputs, b.inputs)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert (out / "identifiers.json").read_text() == (
        tmp_path / "same" / "identifiers.json"
    ).read_text()
    assert not np.array_equal(a.inputs, c.inputs)


def test_augmentation_dedup_keeps_only_distinct_tasks(tmp_path):
    # A task whose grids are square and all black: every dihedral/colour augmentation gives the
    # same task (a non-square one would not: rot90 changes its shape),
    # so after 5 * num_aug tries only the original remains.
    black = {"train": [{"input": [[0, 0], [0, 0]], "output": [[0]]}], "test": [{"input": [[0]]}]}
    stripes = {"train": [{"input": [[1, 2]], "output": [[2, 1]]}], "test": [{"input": [[1]]}]}
    prefix = tmp_path / "k"
    for subset in ("training", "evaluation"):
        (tmp_path / f"k_{subset}_challenges.json").write_text(
            json.dumps({"blk": black, "str": stripes})
        )
        (tmp_path / f"k_{subset}_solutions.json").write_text(
            json.dumps({"blk": [[[0]]], "str": [[[1]]]})
        )
    with pytest.warns(UserWarning, match="2 task ids of test set 'evaluation' also appear"):
        arc.build(
            tmp_path / "o", input_file_prefix=prefix, subsets=["training", "evaluation"], num_aug=10
        )
    names = json.loads((tmp_path / "o" / "identifiers.json").read_text())
    per_task = {t: sum(n.split("|||")[0] == t for n in names) for t in ("blk", "str")}
    # 'blk' appears in both subsets under the same id; 'str' has 10 distinct augmentations each.
    assert per_task["blk"] == 1 and per_task["str"] == 1 + 2 * 10
    with pytest.raises(ValueError, match="test-set-name"):
        arc.build(tmp_path / "p", input_file_prefix=prefix, subsets=["training"], num_aug=0)
    with pytest.raises(FileNotFoundError, match="concept_challenges"):
        arc.build(tmp_path / "p", input_file_prefix=prefix, subsets=["concept", "evaluation"])


# ---------------------------------------------------------------------------------------------
# evaluator


def _test_batches(out, global_batch_size=6, process_index=0, process_count=1):
    return list(
        PuzzleTestDataset(
            out,
            split_name="test",
            global_batch_size=global_batch_size,
            process_index=process_index,
            process_count=process_count,
        )
    )


def _perfect(batch):
    # What a perfect model predicts: the label tokens (PAD where the label is ignored).
    return np.where(batch["labels"] == IGNORE_LABEL, 0, batch["labels"])


def test_evaluator_perfect_predictions_through_augmentations(built, tmp_path):
    out, _ = built
    ev = arc_eval.ARCEvaluator(out)
    ev.begin_eval()
    batches = _test_batches(out)
    assert (batches[-1]["mask"] == 0).any()  # the padded last batch is exercised
    for b in batches:
        ev.update_batch(b, {"preds": _perfect(b), "q_halt_logits": np.zeros(len(b["inputs"]))})
    metrics = ev.result(tmp_path)
    assert metrics == {f"ARC/pass@{k}": 1.0 for k in arc_eval.PASS_KS}
    # Row by row, not just by vote: every augmented row maps back to its true input and output.
    tp = json.loads((out / "test_puzzles.json").read_text())
    truth = {
        (t, arc.grid_hash(np.array(p["input"], np.uint8))): arc.grid_hash(
            np.array(p["output"], np.uint8)
        )
        for t, task in tp.items()
        for p in task["test"]
    }
    votes = ev.local_records()["votes"]
    assert len(votes) == sum(int(b["mask"].sum()) for b in batches)
    assert all(truth[(t, ih)] == ph for t, ih, ph, _ in votes)
    sub = json.loads((tmp_path / "submission.json").read_text())
    assert sorted(sub) == sorted(tp)
    for task_id, t in tp.items():
        assert len(sub[task_id]) == len(t["test"])
        for attempt, pair in zip(sub[task_id], t["test"]):
            assert attempt["attempt_1"] == pair["output"]
            assert attempt["attempt_2"] == pair["output"]  # one candidate: padded by repetition
    # Votes accumulate across eval rounds (upstream's aggregated voting) unless reset.
    n = len(ev.local_records()["votes"])
    ev.begin_eval()
    for b in batches:
        ev.update_batch(b, {"preds": _perfect(b), "q_halt_logits": np.zeros(len(b["inputs"]))})
    assert len(ev.local_records()["votes"]) == 2 * n
    fresh = arc_eval.ARCEvaluator(out, aggregated_voting=False)
    fresh.update_batch(batches[0], {"preds": _perfect(batches[0]), "q_halt_logits": np.zeros(6)})
    fresh.begin_eval()
    assert fresh.local_records()["votes"] == []


def _wrong_seq(label_seq, name):
    """An augmented prediction whose un-augmented grid is a fixed wrong answer (all colour 9 of the
    true shape), so every augmentation votes for the same wrong grid."""
    task_id, tid, perm = arc.parse_name(name)
    g = arc_eval.crop(label_seq)
    g = invert_permutation(perm)[inverse_dihedral_transform(g, tid)]
    wrong = np.full_like(g, 9 if (g != 9).any() else 8)
    return arc.grid_to_seq(dihedral_transform(perm[wrong], tid)), wrong


def test_evaluator_voting_and_q_tie_break(built):
    out, _ = built
    names = json.loads((out / "identifiers.json").read_text())
    batches = _test_batches(out)

    # Originals right, all 3 augmentations wrong (and unanimous): the wrong grid wins on votes.
    ev = arc_eval.ARCEvaluator(out)
    for b in batches:
        preds, q = _perfect(b).copy(), np.zeros(len(b["inputs"]))
        for r, pid in enumerate(b["puzzle_identifiers"]):
            if b["mask"][r] and "|||" in names[pid]:
                preds[r] = _wrong_seq(preds[r], names[pid])[0]
        ev.update_batch(b, {"preds": preds, "q_halt_logits": q})
    m = ev.result()
    assert m["ARC/pass@1"] == 0.0 and m["ARC/pass@2"] == 1.0

    # One vote each for right (original, high q) and wrong (one augmentation, low q); the other
    # augmentations are not fed. Equal votes -> mean sigmoid(q_halt) decides.
    for q_right, expect in ((3.0, 1.0), (-3.0, 0.0)):
        ev = arc_eval.ARCEvaluator(out)
        for b in batches:
            keep = []
            preds, q = _perfect(b).copy(), np.zeros(len(b["inputs"]))
            for r, pid in enumerate(b["puzzle_identifiers"]):
                name = names[pid]
                if not b["mask"][r]:
                    continue
                if "|||" not in name:
                    q[r] = q_right
                    keep.append(r)
                elif name == _first_aug(names, name):
                    preds[r] = _wrong_seq(preds[r], name)[0]
                    keep.append(r)
            sub = {k: v[keep] for k, v in b.items()}
            ev.update_batch(sub, {"preds": preds[keep], "q_halt_logits": q[keep]})
        m = ev.result()
        assert m["ARC/pass@1"] == expect and m["ARC/pass@2"] == 1.0


def _first_aug(names, name):
    task_id = name.split("|||")[0]
    return next(n for n in names if n.startswith(task_id + "|||"))


def test_evaluator_wrong_predictions_score_zero(built, tmp_path):
    out, _ = built
    ev = arc_eval.ARCEvaluator(out)
    for b in _test_batches(out):
        # Predicting the input back: wrong for every task here (no identity task among them).
        ev.update_batch(b, {"preds": b["inputs"], "q_halt_logits": np.zeros(len(b["inputs"]))})
    assert set(ev.result().values()) == {0.0}


def test_per_process_records_merge_to_the_single_process_result(built):
    out, _ = built
    single = arc_eval.ARCEvaluator(out)
    parts = [arc_eval.ARCEvaluator(out) for _ in range(2)]
    for b in _test_batches(out):
        single.update_batch(b, {"preds": _perfect(b), "q_halt_logits": np.linspace(-1, 1, 6)})
    for p, ev in enumerate(parts):  # each "process" sees only its half of every global batch
        for b in _test_batches(out, process_index=p, process_count=2):
            ev.update_batch(
                b, {"preds": _perfect(b), "q_halt_logits": np.linspace(-1, 1, 6)[p * 3 : p * 3 + 3]}
            )
    payloads = [json.loads(json.dumps(ev.local_records())) for ev in parts]
    merged = arc_eval.merge_records(payloads)
    tp = single.test_puzzles
    assert sorted(map(tuple, merged["votes"])) == sorted(
        map(tuple, single.local_records()["votes"])
    )
    assert arc_eval.score(merged, tp) == arc_eval.score(single.local_records(), tp)


_WORKER = """
import json, sys
import numpy as np
import jax

out, addr, pid, result_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
jax.distributed.initialize(coordinator_address=addr, num_processes=2, process_id=pid)
from data import arc_eval
from data.puzzle_source import PuzzleTestDataset

ev = arc_eval.ARCEvaluator(out)
if pid == 1:  # process 0 records nothing: its score can only come from process 1's votes
    for b in PuzzleTestDataset(out, split_name="test", global_batch_size=6):  # jax.process_index()
        preds = np.where(b["labels"] == -100, 0, b["labels"])
        ev.update_batch(b, {"preds": preds, "q_halt_logits": np.zeros(3)})
local = arc_eval.score(ev.local_records(), ev.test_puzzles)[0]
m = ev.result(result_path)
json.dump({"metrics": m, "local": local}, open(f"{result_path}/p{pid}.json", "w"))
"""


@pytest.mark.multiprocess
def test_two_jax_processes_gather_votes_on_process_0(built, tmp_path):
    import os
    import socket
    import subprocess
    import sys

    out, _ = built
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        JAX_NUM_CPU_DEVICES="1",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        PYTHONPATH=os.getcwd(),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(out), f"127.0.0.1:{port}", str(p), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for p in range(2)
    ]
    try:
        logs = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    r0, r1 = (json.loads((tmp_path / f"p{p}.json").read_text()) for p in range(2))
    assert r1["metrics"] is None  # only process 0 scores
    assert set(r0["local"].values()) == {0.0} and r1["local"]["ARC/pass@1"] > 0
    assert r0["metrics"] == r1["local"]  # process 0 scored process 1's gathered votes
    assert (tmp_path / "submission.json").exists()


def test_full_arc1_subsets_match_upstream_counts(shared_data_dir, tmp_path):
    # Upstream's verified num_aug=2 build: 960 train groups, mean 4.15 examples per puzzle, 400
    # test groups. The mean does not depend on num_aug (augmentations copy the example count).
    s = arc.build(
        tmp_path / "a",
        input_file_prefix=f"{shared_data_dir}/trm-arc-kaggle-combined/arc-agi",
        num_aug=0,
    )
    assert (s["train_groups"], s["test_groups"], s["test_examples"]) == (960, 400, 419)
    assert round(s["train_mean_puzzle_examples"], 2) == 4.15
    assert s["test_ids_in_other_subsets"] == 0


def test_download_path_through_a_file_url(kaggle_prefix, tmp_path, monkeypatch):
    import os

    src = os.path.dirname(kaggle_prefix)
    monkeypatch.setattr(arc, "UPSTREAM_URL", f"file://{src}/arc-agi_{{subset}}_{{kind}}.json")
    s = arc.main(
        [
            "--download",
            "--download-dir",
            str(tmp_path / "dl"),
            "--output-dir",
            str(tmp_path / "o"),
            "--subsets",
            "training",
            "evaluation",
            "--num-aug",
            "1",
        ]
    )
    assert s["train_groups"] == TRAIN_TASKS + EVAL_TASKS
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == sorted(
        f"arc-agi_{s}_{k}.json"
        for s in ("training", "evaluation")
        for k in ("challenges", "solutions")
    )
    with pytest.raises(RuntimeError, match="offline"):
        arc.download(["concept"], tmp_path / "dl")


def test_test_puzzles_share_identifiers_with_train_and_load_through_grain(built):
    from data.puzzle_source import PuzzleTrainDataset

    out, _ = built
    train = load_split(out, "train", raw=True).all
    test = load_split(out, "test", raw=True).all
    # The puzzle embedding a test row looks up was trained on that puzzle's demonstrations.
    assert set(test.puzzle_identifiers.tolist()) <= set(train.puzzle_identifiers.tolist())
    ds = PuzzleTrainDataset(
        out,
        split_name="train",
        global_batch_size=8,
        seed=0,
        process_index=0,
        process_count=1,
        num_iterations=1,
    )
    batches = list(ds)
    assert batches, "one iteration over 7 groups must fill at least one batch of 8"
    for b in batches:
        assert b["inputs"].shape == (8, 900) and (b["puzzle_identifiers"] > 0).all()
        assert set(np.unique(b["labels"])) <= {IGNORE_LABEL, *range(1, 12)}  # PAD -> ignored


def _crop_reference(seq: np.ndarray) -> np.ndarray:
    """data.arc_eval's crop rule as a row-by-row loop, to test the vectorised version against."""
    grid = np.asarray(seq).reshape(arc.GRID, arc.GRID)
    offset = arc.COLOUR_OFFSET
    is_colour = (grid >= offset) & (grid < offset + 10)
    best, best_shape, width = 0, (0, 0), arc.GRID
    for r in range(arc.GRID):
        stops = np.flatnonzero(~is_colour[r, :width])
        if stops.size:
            width = int(stops[0])
        if width == 0:
            break
        if (r + 1) * width > best:
            best, best_shape = (r + 1) * width, (r + 1, width)
    h, w = best_shape
    return (grid[:h, :w] - offset).astype(np.uint8)


def test_vectorised_crop_matches_the_row_scan():
    rng = np.random.default_rng(0)
    rows = [rng.choice(12, size=900, p=[0.01, 0.01] + [0.098] * 10) for _ in range(500)]
    for _ in range(500):  # encoded grids of random shapes at random offsets (train-style)
        h, w = rng.integers(1, 31, size=2)
        g = rng.integers(0, 10, size=(h, w)).astype(np.uint8)
        off = (int(rng.integers(0, 31 - h)), int(rng.integers(0, 31 - w)))
        rows.append(arc.grid_to_seq(g, off))
    stair = np.full((30, 30), 5, np.uint8)  # widths 30, 20, 12, 12, 3, ...: best area mid-way
    for r, w in enumerate([30, 20, 12, 12, 12, 3]):
        stair[r, w:] = 0
    stair[6:] = 0
    rows += [stair.reshape(-1), np.full(900, 7, np.uint8), np.zeros(900, np.uint8)]
    shapes = arc_eval.crop_shapes(np.stack(rows))
    for seq, shape in zip(rows, shapes):
        ref = _crop_reference(seq)
        assert tuple(shape) == ref.shape
        np.testing.assert_array_equal(arc_eval.crop(seq), ref)
    assert tuple(shapes[-3]) == (5, 12) and tuple(shapes[-2]) == (30, 30)
    assert tuple(shapes[-1]) == (0, 0)


def test_score_ranking_padding_and_missing_predictions():
    g = {k: np.full((1, 1), k, np.uint8) for k in range(4)}
    h = {k: arc.grid_hash(v) for k, v in g.items()}
    tp = {
        "a": {
            "train": [],
            "test": [{"input": [[0]], "output": [[2]]}, {"input": [[1]], "output": [[3]]}],
        }
    }
    votes = [["a", h[0], h[1], 0.9], ["a", h[0], h[2], 0.2], ["a", h[0], h[2], 0.4]]
    records = {"votes": votes, "grids": {h[k]: g[k].tolist() for k in g}}
    m, sub = arc_eval.score(records, tp, pass_Ks=(1, 2), submission_K=3)
    # Input 0: grid 2 (2 votes) beats grid 1 (1 vote, higher q). Input 1: no prediction -> 0.
    assert m == {"ARC/pass@1": 0.5, "ARC/pass@2": 0.5}
    assert sub["a"][0] == {"attempt_1": [[2]], "attempt_2": [[1]], "attempt_3": [[2]]}
    assert sub["a"][1] == {"attempt_1": [[0]], "attempt_2": [[0]], "attempt_3": [[0]]}


def test_missing_solutions_file_fills_dummy_outputs(kaggle_prefix, tmp_path):
    import shutil

    prefix = tmp_path / "arc-agi"
    shutil.copy(
        f"{kaggle_prefix}_evaluation_challenges.json", f"{prefix}_evaluation_challenges.json"
    )
    with pytest.warns(UserWarning, match="solutions.json not found"):
        arc.build(tmp_path / "o", input_file_prefix=prefix, subsets=["evaluation"], num_aug=0)
    tp = json.loads((tmp_path / "o" / "test_puzzles.json").read_text())
    assert len(tp) == EVAL_TASKS and all(
        p["output"] == [[0]] for t in tp.values() for p in t["test"]
    )
