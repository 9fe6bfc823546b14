"""`python -m train.evaluate`: the trainer's own numbers from a run directory, an exported
upstream-format checkpoint and a Sudoku CSV; per-step accuracy, --extra-steps, --halt, --show,
ARC pass@K, test-time scaling (--trajectories, --noise), and one-line errors. One tiny TRM run is
trained per module."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from data.puzzle_format import load_split
from parity.compare import EXACT, assert_close
from tests.helpers import REPO, build_tiny_sudoku, tiny_trm_overrides
from train.compose import load_config
from train.errors import ConfigError
from train.evaluate import evaluate, main
from train.families.trm.show import Board, render_text, shown
from train.families.trm.weights import upstream_overrides
from train.mesh import make_mesh
from train.metrics import read_jsonl
from train.trainer import train

FLOAT32_LOSS = ["model.loss_dtype=float32"]  # no process-wide x64 switch in this worker


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run dir, data dir, overrides): trm_sudoku_tiny shrunk, 2 evaluations (steps 2 and 4)."""
    root = tmp_path_factory.mktemp("evaluate")
    data = build_tiny_sudoku(str(root / "sudoku"))
    overrides = tiny_trm_overrides(data, str(root / "runs"), "tiny") + FLOAT32_LOSS
    cfg = load_config(overrides)
    train(cfg, make_mesh(cfg.mesh))
    return str(root / "runs" / "tiny"), data, overrides


def _logged_evals(run_dir):
    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")}
        for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
        if "eval/all/exact_accuracy" in r
    }


def _same(name, got: dict, want: dict):
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for k in want:
        assert_close(f"{name} {k}", np.float64(got[k]), np.float64(want[k]), EXACT)


@pytest.mark.slow
def test_run_directory_gives_the_trainers_eval_exactly(run):
    """Every eval metric the trainer logged at steps 2 and 4 (latest and --step), bit for bit;
    the per-step curve has halt_max_steps entries and its last entry is the reported one."""
    run_dir, data, _ = run
    logged = _logged_evals(run_dir)
    assert sorted(logged) == [2, 4]
    latest = evaluate(run_dir)
    assert latest["step"] == 4 and latest["data"] == data and latest["count"] == 16
    _same("latest", latest["metrics"], logged[4])
    _same("--step 2", evaluate(run_dir, step=2)["metrics"], logged[2])
    ps = latest["per_step"]
    assert len(ps["exact_accuracy"]) == len(ps["token_accuracy"]) == 4  # halt_max_steps
    assert ps["exact_accuracy"][-1] == latest["exact_accuracy"]
    assert ps["token_accuracy"][-1] == latest["token_accuracy"]
    assert latest["mean_steps"] == 4.0
    # the steps differ from one another (the curve is per step, not one number repeated)
    assert len(set(ps["token_accuracy"])) > 1, ps


@pytest.mark.slow
def test_a_run_whose_data_set_moved_evaluates_on_data(run, tmp_path):
    """config.yaml records the data set's sizes (seq_len, vocabulary, puzzle identifiers): a run
    whose data.path is gone opens from it alone, and --data gives the trainer's numbers; without
    --data the one line says what to pass."""
    run_dir, data, _ = run
    with open(os.path.join(run_dir, "config.yaml")) as f:
        saved = yaml.safe_load(f)
    assert {k: saved["data"][k] for k in ("seq_len", "vocab_size", "num_puzzle_identifiers")} == {
        "seq_len": 81, "vocab_size": 11, "num_puzzle_identifiers": 1}  # fmt: skip
    moved = str(tmp_path / "run")
    shutil.copytree(run_dir, moved)
    saved["data"]["path"] = str(tmp_path / "gone")
    with open(os.path.join(moved, "config.yaml"), "w") as f:
        yaml.safe_dump(saved, f)
    _same("moved run + --data", evaluate(moved, data=data)["metrics"], _logged_evals(run_dir)[4])
    assert "is not on disk; pass --data PATH" in _one_line_error(None, [moved])


@pytest.mark.slow
def test_extra_steps_extend_the_curve_and_keep_its_first_steps(run):
    run_dir, _, _ = run
    base = evaluate(run_dir)
    more = evaluate(run_dir, extra_steps=3)
    assert more["steps_run"] == 7 and more["mean_steps"] == 7.0
    for key in ("exact_accuracy", "token_accuracy"):
        assert len(more["per_step"][key]) == 7
        assert more["per_step"][key][:4] == base["per_step"][key]  # the same first 4 steps
        assert more[key] == more["per_step"][key][-1]  # reported: the last step run
    # steps 5.. continue the recursion: a restart from a fresh carry would repeat steps 1..
    assert more["per_step"]["token_accuracy"][4:] != base["per_step"]["token_accuracy"][:3]
    assert more["count"] == base["count"]


@pytest.mark.slow
def test_sudoku_csv_gives_the_numbers_of_the_same_puzzles(run, tmp_path):
    """The test split written as a Sudoku-Extreme CSV (source,question,answer,rating) evaluates
    to the split's own numbers."""
    run_dir, data, _ = run
    split = load_split(data, "test").sets["all"]
    path = tmp_path / "test.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "question", "answer", "rating"])
        for q, a in zip(split.inputs, split.labels):
            qs = "".join("." if t == 1 else str(t - 1) for t in q)
            w.writerow(["gen", qs, "".join(str(t - 1) for t in a), 0])
    via_csv = evaluate(run_dir, data=str(path))
    _same("csv", via_csv["metrics"], evaluate(run_dir)["metrics"])


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    pytest.importorskip("torch")
    from train.export import export

    run_dir, _, _ = run
    return export(run_dir, str(tmp_path_factory.mktemp("export") / "step_4"))


def _upstream_overrides(overrides):
    """The run's model/data settings without its run-directory ones."""
    return [o for o in overrides if not o.startswith(("run.", "logging.", "trainer.log"))]


@pytest.mark.slow
def test_exported_upstream_checkpoint_evaluates_like_its_run(run, exported, tmp_path):
    """train.export's upstream state_dict, configured by overrides and by an upstream
    all_config.yaml beside it: the run's numbers, bit for bit."""
    run_dir, data, overrides = run
    want = _logged_evals(run_dir)[4]
    got = evaluate(exported, data=data, overrides=_upstream_overrides(overrides))
    assert got["kind"] == "upstream_trm"
    _same("exported + overrides", got["metrics"], want)

    cfg = load_config(overrides)
    arch = {k: v for k, v in dict(cfg.model).items() if k not in ("remat", "scan")}
    all_config = {
        "arch": {"name": "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1", **arch,
                 "loss": {"name": "losses@ACTLossHead", "loss_type": "stablemax_cross_entropy"}},
        "data_paths": [data], "evaluators": [], "global_batch_size": 16, "ema": True,
    }  # fmt: skip
    beside = tmp_path / "step_4"
    shutil.copy(exported, beside)
    (tmp_path / "all_config.yaml").write_text(json.dumps(all_config))  # JSON is YAML
    from_yaml = evaluate(str(beside), overrides=FLOAT32_LOSS)
    _same("exported + all_config.yaml", from_yaml["metrics"], want)
    assert "model.arch=trm" in upstream_overrides(all_config)


@pytest.mark.slow
def test_halt_scores_each_row_where_the_q_head_halts(run, exported, tmp_path):
    """A checkpoint whose Q head always says halt (q_halt = +5): with --halt every row stops
    after ACT step 1, so the report is step 1's accuracy; without --halt, nothing changes."""
    import torch

    run_dir, data, overrides = run
    sd = torch.load(exported, weights_only=True)
    key = next(k for k in sd if k.endswith("q_head.weight"))
    sd[key] = torch.zeros_like(sd[key])
    sd[key.replace("weight", "bias")] = torch.tensor([5.0, -5.0])
    path = str(tmp_path / "halting")
    torch.save(sd, path)
    ov = _upstream_overrides(overrides)
    plain = evaluate(path, data=data, overrides=ov)
    halted = evaluate(path, data=data, overrides=ov, halt=True)
    assert plain["mean_steps"] == 4.0 and halted["mean_steps"] == 1.0
    assert halted["per_step"] == plain["per_step"]  # the curve itself never halts
    assert halted["exact_accuracy"] == plain["per_step"]["exact_accuracy"][0]
    assert_close(
        "--halt token accuracy vs step 1",
        np.float64(halted["token_accuracy"]),
        np.float64(plain["per_step"]["token_accuracy"][0]),
        EXACT,
    )
    assert halted["token_accuracy"] != plain["token_accuracy"]
    # q_halt >= 0 says "this row is right" for every row: q-halt accuracy = exact accuracy
    assert halted["q_halt_accuracy"] == halted["exact_accuracy"]


@pytest.mark.slow
def test_show_prints_the_boards_of_every_step(run, capsys):
    """--show 2 on a barely trained run: two test puzzles with their input and answer, every ACT
    step's board, the wrong cells marked; the recursion fixes none of them, which one line says
    before the first two are shown."""
    run_dir, data, _ = run
    main([run_dir, "--show", "2"])
    out = capsys.readouterr().out
    assert "none of 16 test puzzles is wrong after ACT step 1 and right after step 4" in out
    split = load_split(data, "test").sets["all"]
    for i in range(2):
        assert f"test puzzle {i}: " in out
        first_row = " ".join("." if t == 1 else str(t - 1) for t in split.inputs[i][:9])
        answer_row = " ".join(str(t - 1) for t in split.labels[i][:9])
        assert first_row in out and answer_row in out
    boards = out[out.index("test puzzle 0: ") :]
    assert boards.count("step 4") == 2 and "step 5" not in boards  # halt_max_steps boards each
    assert "*" in out  # a tiny run gets cells wrong, and they are marked


def _board(row: int, wrong_after: list[bool]) -> Board:
    """A Sudoku board of test row `row` whose prediction is wrong (one cell) after the steps
    where `wrong_after` says so."""
    answer = np.tile(np.arange(2, 11), 9).reshape(9, 9)
    steps = []
    for wrong in wrong_after:
        pred = answer.copy()
        pred[0, 0] = 1 if wrong else pred[0, 0]
        steps.append(pred)
    return Board("sudoku", answer, answer, steps, [False] * len(steps), row)


def test_show_picks_the_puzzles_the_recursion_fixes():
    """--show N's choice (show.shown): first the puzzles wrong after ACT step 1 and right after
    the last, in test order, then the first others; fewer than N such puzzles: one line says
    so. The text names each puzzle's test row and what the recursion did to it."""
    right, fixed, broken = [False] * 3, [True, True, False], [False, False, True]
    boards = [
        _board(0, right), _board(1, broken), _board(2, fixed), _board(3, [True] * 3),
        _board(4, fixed),
    ]  # fmt: skip
    chosen, note = shown(boards, 1)
    assert [b.row for b in chosen] == [2] and note is None
    chosen, note = shown(boards, 3)
    assert [b.row for b in chosen] == [2, 4, 0]
    assert note == (
        "only 2 of 5 test puzzles are wrong after ACT step 1 and right after step 3; shown first, "
        "then the first others"
    )
    chosen, note = shown([b for b in boards if not b.fixed_by_recursion()], 1, count=100)
    assert [b.row for b in chosen] == [0]
    assert note == (
        "none of 100 test puzzles is wrong after ACT step 1 and right after step 3; showing the first"
    )
    text = render_text([boards[2], boards[0], boards[1], boards[3]], width=400)
    assert (
        "test puzzle 2: wrong after ACT steps 1-2, solved at step 3 (3 steps; * = wrong cell; "
        "q: halt = the Q head would stop, not applied)" in text
    )
    assert "test puzzle 0: solved at ACT step 1 (3 steps" in text
    assert "test puzzle 1: solved at ACT step 1, wrong again at step 3 (3 steps" in text
    assert "test puzzle 3: not solved (3 steps" in text


def test_board_labels_say_what_the_header_says_of_halting():
    """Where the Q head says halt: without --halt (the header's "no halting") the label says the
    Q head would stop there, not applied; with --halt, the step the row halted at; never a bare
    "(halt)"."""
    b = _board(0, [True, False, False])
    b.halts = [False, True, True]
    plain = render_text([b], width=400)
    titles = [t.strip() for t in plain.splitlines()[1].split(" | ")]
    assert titles == ["input", "step 1", "step 2 (q: halt)", "step 3 (q: halt)", "answer"]
    halted = render_text([b], width=400, halting=True)
    titles = [t.strip() for t in halted.splitlines()[1].split(" | ")]
    assert titles == ["input", "step 1", "step 2 (halted)", "step 3", "answer"]
    assert "halted = the row's answer" in halted.splitlines()[0]
    assert "(halt)" not in plain + halted


@pytest.mark.slow
def test_json_and_plot_outputs(run, tmp_path):
    pytest.importorskip("matplotlib")
    run_dir, _, _ = run
    out, png = tmp_path / "r.json", tmp_path / "acc.png"
    main([run_dir, "--json", str(out), "--plot", str(png), "--show", "1", "--extra-steps", "1"])
    r = json.loads(out.read_text())
    for key in ("exact_accuracy", "token_accuracy", "count", "per_step"):
        assert key in r
    assert len(r["per_step"]["exact_accuracy"]) == 5
    for p in (png, tmp_path / "acc_show.png", tmp_path / "acc_show.gif"):
        assert p.stat().st_size > 1000, p


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _one_line_error(capsys_or_none, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    msg = str(e.value.code)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    return msg


@pytest.mark.slow
def test_bad_input_is_one_line(run, exported, tmp_path):
    run_dir, data, overrides = run
    assert "--step 3 not saved; checkpoints: [2, 4]" in _one_line_error(
        None, [run_dir, "--step", "3"]
    )
    assert "no all_config.yaml beside it" in _one_line_error(None, [exported, "--data", data])
    # a checkpoint that does not fit the config (another hidden size)
    bad = [*_upstream_overrides(overrides), "model.hidden_size=32"]
    assert "does not fit the config" in _one_line_error(None, [exported, "--data", data, *bad])
    # a data set whose sequences do not fit the model (4x4 grids for a 9x9 model)
    from data.puzzle_format import PuzzleArrays, make_metadata, write_dataset

    arrays = PuzzleArrays(
        inputs=np.ones((2, 16), np.uint8), labels=np.full((2, 16), 2, np.uint8),
        puzzle_identifiers=np.zeros(2, np.int32), puzzle_indices=np.arange(3, dtype=np.int32),
        group_indices=np.arange(3, dtype=np.int32),
    )  # fmt: skip
    meta = make_metadata(arrays, vocab_size=11, pad_id=0, ignore_label_id=0,
                         blank_identifier_id=0, num_puzzle_identifiers=1, total_puzzles=2,
                         mean_puzzle_examples=1.0)  # fmt: skip
    small = tmp_path / "small"
    write_dataset(small, {"test": (meta, {"all": arrays})}, ["<blank>"])
    msg = _one_line_error(None, [run_dir, "--data", str(small)])
    assert "seq_len=16, but the model has seq_len=81" in msg
    assert "--batch=3 is not divisible by the 8 devices" in _one_line_error(
        None, [run_dir, "--batch", "3"]
    )
    with pytest.raises(ConfigError, match="--extra-steps -1"):
        evaluate(run_dir, extra_steps=-1)
    assert "mesh=nope: no " in _one_line_error(None, [run_dir, "mesh=nope"])
    (tmp_path / "file").write_text("mine")
    assert _one_line_error(None, [run_dir, "--plot", str(tmp_path / "file" / "acc.png")]) == (
        f"error: --plot {tmp_path / 'file' / 'acc.png'}: a file stands where its folder must be"
    )
    assert "--data " + str(tmp_path / "bad.csv") + ":2: expected 4 columns" in _one_line_error(
        None, [run_dir, "--data", _write(tmp_path / "bad.csv", "a,b\n1,2\n")]
    )
    # overrides of a run's config: another mesh preset and eval batch, the same counts
    base = evaluate(run_dir)
    other = evaluate(run_dir, overrides=["mesh=cpu", "data.eval_batch_size=8"])
    for key in ("exact_accuracy", "count", "mean_steps"):
        assert other[key] == base[key]


@pytest.mark.slow
def test_a_reshaping_override_is_one_line_on_a_loaded_machine(run):
    """`train.evaluate RUN model.hidden_size=8`: the restore fails on a shape misfit and leaves
    Orbax's other reads pending; the command prints its one line and nothing else, also with both
    cores busy (three runs beside two busy loops), where the reads complete after the settling
    wait and are finalized at exit: without the guard that stays installed after a failed restore,
    four runs in five printed 60 to 1,700 lines of TensorStore reports after the line
    (train/checkpoint.py `_keep_dropping_abandoned_reads`; docs/training.md, "A failed Orbax
    restore leaves its other reads running")."""
    run_dir = run[0]
    cmd = [sys.executable, "-m", "train.evaluate", run_dir, "model.hidden_size=8"]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for _ in range(3):
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
            lines = [line for line in proc.stderr.splitlines() if "compilation cache" not in line]
            assert proc.returncode == 1 and len(lines) == 1, (len(lines), proc.stderr[-3000:])
            assert lines[0].startswith("error: ") and "does not restore onto the model" in lines[0]
            assert "not compatible with the stored shape" in lines[0], lines[0]
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_a_json_file_that_cannot_be_written_is_one_line_before_the_work(tmp_path):
    """--json naming a folder, or under a file: one line before any checkpoint is read (a run
    directory whose config.yaml names its family is enough to get there); a new folder is made.
    --plot's case: test_bad_input_is_one_line."""
    (tmp_path / "file").write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("family: trm\n")
    msg = _one_line_error(None, [str(run), "--json", str(tmp_path / "file" / "x.json")])
    assert msg == f"error: --json {tmp_path / 'file' / 'x.json'}: a file stands where its " \
        "folder must be", msg  # fmt: skip
    msg = _one_line_error(None, [str(run), "--json", str(tmp_path)])
    assert msg == f"error: --json {tmp_path}: a folder; expected a file name", msg
    _one_line_error(None, [str(run), "--json", str(tmp_path / "new" / "r.json")])  # no checkpoint
    assert (tmp_path / "new").is_dir() and (tmp_path / "file").read_text() == "mine"


def test_bad_source_is_one_line(tmp_path):
    assert "no such file or run directory" in _one_line_error(None, [str(tmp_path / "nope")])
    assert "without config.yaml" in _one_line_error(None, [str(tmp_path)])
    run = tmp_path / "run"  # a run directory as far as its family goes; --data is checked first
    run.mkdir()
    (run / "config.yaml").write_text("family: trm\n")
    assert "--data" in _one_line_error(None, [str(run), "--data", str(tmp_path / "y")])
    (run / "config.yaml").write_text("family: vit\n")
    assert "config.yaml: family must be one of" in _one_line_error(None, [str(run)])


# --- ARC --------------------------------------------------------------------------------------
def _arc_tasks(n: int, seed: int, prefix: str):
    """Kaggle-layout tasks; even-numbered tasks are the identity (output = input), odd ones
    shift every colour by 1."""
    rng = np.random.default_rng(seed)
    challenges, solutions = {}, {}
    for t in range(n):

        def pair(t=t):
            g = rng.integers(0, 10, size=tuple(rng.integers(2, 6, size=2)))
            return g.tolist(), (g if t % 2 == 0 else (g + 1) % 10).tolist()

        demos, (ti, to) = [pair() for _ in range(2)], pair()
        name = f"{prefix}{t:04x}"
        challenges[name] = {"train": [{"input": i, "output": o} for i, o in demos],
                            "test": [{"input": ti}]}  # fmt: skip
        solutions[name] = [to]
    return challenges, solutions


def _copy_model_checkpoint(path: str, num_puzzle_identifiers: int, arch: dict) -> None:
    """An upstream-format TRM whose prediction is its input, by construction: every block weight,
    latent init, puzzle embedding and q weight is zero, so each block is an RMS norm of its input
    and z_H ends up a positive multiple of the token embedding; token v embeds as the unit vector
    e_v and lm_head reads e_v back, so argmax(logits) is the input token at every cell."""
    import torch
    from flax import nnx

    from models.trm import TRM, TRMConfig
    from parity.trm_params import to_torch

    cfg = TRMConfig(batch_size=8, seq_len=900, vocab_size=12,
                    num_puzzle_identifiers=num_puzzle_identifiers, **arch)  # fmt: skip
    sd = {k: torch.zeros_like(v) for k, v in to_torch(TRM(cfg, rngs=nnx.Rngs(0))).items()}
    eye = torch.eye(12, arch["hidden_size"])
    sd["model.inner.embed_tokens.embedding_weight"] = eye
    sd["model.inner.lm_head.weight"] = eye.clone()
    torch.save(sd, path)


def test_arc_pass_at_k_of_a_model_that_copies_its_input(tmp_path):
    """ARC through the voting evaluator, on a data set built by data.arc from 4 evaluation tasks
    (2 identity, 2 not) with 2 augmentations each: a model that predicts its input (augmented
    grid, un-augmented by the evaluator) solves exactly the identity tasks: pass@1 = pass@2 =
    0.5; exact accuracy = the share of test rows whose answer equals their input."""
    pytest.importorskip("torch")
    from data import arc

    prefix = tmp_path / "kaggle" / "arc-agi"
    prefix.parent.mkdir()
    for subset, n, seed in (("training", 2, 0), ("evaluation", 4, 1)):
        ch, so = _arc_tasks(n, seed, prefix=f"{subset[:2]}00")
        (tmp_path / "kaggle" / f"arc-agi_{subset}_challenges.json").write_text(json.dumps(ch))
        (tmp_path / "kaggle" / f"arc-agi_{subset}_solutions.json").write_text(json.dumps(so))
    data = str(tmp_path / "arc")
    arc.main(["--input-file-prefix", str(prefix), "--output-dir", data, "--num-aug", "2",
              "--subsets", "training", "evaluation", "--test-set-name", "evaluation"])  # fmt: skip
    ids = json.loads((tmp_path / "arc" / "identifiers.json").read_text())
    arch = dict(H_cycles=1, L_cycles=1, L_layers=1, H_layers=0, hidden_size=16, num_heads=2,
                expansion=1.0, pos_encodings="none", halt_max_steps=2, puzzle_emb_ndim=16,
                puzzle_emb_len=1, forward_dtype="float32", mlp_t=False)  # fmt: skip
    ckpt = tmp_path / "ckpt" / "step_1"
    ckpt.parent.mkdir()
    _copy_model_checkpoint(str(ckpt), len(ids), arch)
    all_config = {
        "arch": {"name": "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1", **arch},
        "data_paths": [data], "evaluators": [{"name": "arc@ARC"}], "global_batch_size": 8,
    }  # fmt: skip
    (ckpt.parent / "all_config.yaml").write_text(json.dumps(all_config))
    r = evaluate(str(ckpt), overrides=FLOAT32_LOSS, save_dir=str(tmp_path / "out"))
    assert r["pass@1"] == r["pass@2"] == r["ARC/pass@2"] == 0.5, r
    split = load_split(data, "test").sets["all"]
    # rows whose labelled cells (PAD: -100 once loaded) all equal the input
    same = np.mean([((i == lab) | (lab <= 0)).all() for i, lab in zip(split.inputs, split.labels)])
    assert r["count"] == len(split.inputs) and r["exact_accuracy"] == same, (r, same)
    sub = json.loads((tmp_path / "out" / "submission.json").read_text())
    ch, so = _arc_tasks(4, 1, prefix="ev00")
    for t, name in enumerate(sorted(so)):  # identity tasks: attempt_1 is the answer
        assert (sub[name][0]["attempt_1"] == so[name][0]) == (t % 2 == 0)
    # the same tasks built with another augmentation count number their puzzles differently
    other = str(tmp_path / "arc_aug1")
    arc.main(["--input-file-prefix", str(prefix), "--output-dir", other, "--num-aug", "1",
              "--subsets", "training", "evaluation", "--test-set-name", "evaluation"])  # fmt: skip
    with pytest.raises(ConfigError, match="identifiers.json differs from the run's"):
        evaluate(str(ckpt), data=other, overrides=FLOAT32_LOSS)


# --- nanoGPT ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_nanogpt_run_and_ckpt_pt_give_the_trainers_losses(tmp_path):
    """A tiny GPT run's logged eval losses, from its run directory and from its exported
    nanoGPT ckpt.pt (+ --data), bit for bit (the trainer's estimate_loss batches and seed)."""
    pytest.importorskip("torch")
    from tests.helpers import build_tiny_text, tiny_gpt_overrides
    from train.export import export

    data = build_tiny_text(str(tmp_path / "text"))
    overrides = tiny_gpt_overrides(data, str(tmp_path / "runs"), "gpt")
    cfg = load_config(overrides)
    train(cfg, make_mesh(cfg.mesh))
    run_dir = str(tmp_path / "runs" / "gpt")
    last = [r for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if "eval/val_loss" in r]
    want = last[-1]
    from_run = evaluate(run_dir)
    assert from_run["kind"] == "run"
    ckpt = export(run_dir, str(tmp_path / "ckpt.pt"))
    from_pt = evaluate(ckpt, data=data, overrides=_upstream_overrides(overrides))
    assert from_pt["kind"] == "nanogpt"
    for r in (from_run, from_pt):
        assert r["val_loss"] == want["eval/val_loss"] and r["train_loss"] == want["eval/train_loss"]


@pytest.mark.slow
def test_one_trajectory_without_noise_is_the_plain_evaluation(run):
    """`--trajectories 1 --noise 0` gives the plain report, every key and value EXACTLY, plus
    its `trajectories` block (one k, the oracle = the plain exact accuracy)."""
    run_dir, _, _ = run
    plain = evaluate(run_dir)
    one = evaluate(run_dir, trajectories=1, noise=0.0)
    block = one.pop("trajectories")
    assert one == plain
    assert block["trajectories"] == 1 and block["noise"] == 0.0 and block["latents"] == ["z_L"]
    assert list(block["by_k"]) == [1]
    assert block["oracle_exact_accuracy"] == plain["exact_accuracy"]
    assert block["by_k"][1]["exact_accuracy"] == plain["exact_accuracy"]


@pytest.mark.slow
def test_trajectories_are_reproducible_differ_and_report_every_k(run):
    """The same --seed gives the same report; another seed another; the trajectories differ
    (their losses are not the plain one); the curve has k = 1, 2, 4 and the oracle never falls
    below the chosen answer's accuracy nor decreases with k."""
    run_dir, _, _ = run
    kw = dict(trajectories=4, noise=2.0, batch=32)
    a, b = evaluate(run_dir, seed=3, **kw), evaluate(run_dir, seed=3, **kw)
    assert a == b
    c = evaluate(run_dir, seed=4, **kw)
    assert c["lm_loss"] != a["lm_loss"]
    assert a["lm_loss"] != evaluate(run_dir)["lm_loss"]
    t = a["trajectories"]
    assert list(t["by_k"]) == [1, 2, 4] and t["trajectory_count"] == 4 * a["count"]
    oracle = [m["oracle_exact_accuracy"] for m in t["by_k"].values()]
    assert oracle == sorted(oracle)
    assert all(m["oracle_exact_accuracy"] >= m["exact_accuracy"] for m in t["by_k"].values())
    assert a["exact_accuracy"] == t["by_k"][4]["exact_accuracy"]
    vote = evaluate(run_dir, seed=3, select="vote", **kw)
    assert vote["trajectories"]["select"] == "vote" and vote["lm_loss"] == a["lm_loss"]


@pytest.mark.slow
def test_trajectory_options_fail_in_one_line(run):
    run_dir, _, _ = run
    cases = {
        ("--select", "vote"): "--select: only with --trajectories K",
        ("--trajectories", "0"): "--trajectories 0: expected >= 1",
        ("--trajectories", "2", "--noise", "-1"): "--noise -1.0: expected a standard deviation",
        ("--trajectories", "2", "--noise", "1", "--show", "1"): "--show draws the plain recursion",
        ("--trajectories", "2"): "--trajectories 2 without noise runs 2 identical copies",
        (
            "--trajectories",
            "2",
            "--noise",
            "1",
            "--noise-latents",
            "z_Q",
        ): "'z_Q' is not a latent of arch trm",
    }
    for argv, expected in cases.items():
        assert expected in _one_line_error(None, [run_dir, *argv]), argv


def test_export_without_torch_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    """The demo's environment has no torch: `train.export` says which extra to install, in one
    line, before it opens anything (torch emulated absent: an import of it raises). A run of a
    family that writes no original checkpoint gets that family's line instead, as with torch:
    installing torch would not help it."""
    import sys

    from train.export import main

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SystemExit) as e:  # sys.exit(message): status 1, the message on stderr
        main([str(tmp_path / "run"), "--out", str(tmp_path / "x.pt")])
    line = str(e.value.code)
    assert line.startswith("error: ") and "\n" not in line, line
    assert "pip install -e '.[parity]'" in line, line
    toy = tmp_path / "toy"  # config.yaml alone (an older version's `task:`): nothing else is read
    toy.mkdir()
    (toy / "config.yaml").write_text("task: tests.toy_family\n")
    with pytest.raises(SystemExit) as e:
        main([str(toy), "--out", str(tmp_path / "x.pt")])
    assert e.value.code == (
        "error: tests.toy_family: the family writes no checkpoint in an original code base's "
        "format (Task.torch_checkpoint)"
    )
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("noise", [None, 0.0])
def test_trajectories_without_noise_are_refused_in_one_line(noise):
    """K > 1 trajectories with no noise would be K copies of the same run: refused before any
    compute, naming the missing option (K = 1 with noise 0 stays the plain evaluation's twin)."""
    from train.families.trm.evaluate import TRMEvalOptions

    with pytest.raises(ConfigError, match=r"--trajectories 8 without noise .* add --noise SIGMA"):
        TRMEvalOptions(trajectories=8, noise=noise).scaling  # noqa: B018
    assert TRMEvalOptions(trajectories=1, noise=0.0).scaling.trajectories == 1


def test_plot_without_matplotlib_is_one_line_before_the_evaluation(
    run, tmp_path, monkeypatch, capsys
):
    """--plot in an environment without matplotlib (emulated: importing it raises) stops before
    the evaluation runs (no report printed), in one line naming the extra."""
    import sys

    run_dir, _, _ = run
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    msg = _one_line_error(None, [run_dir, "--plot", str(tmp_path / "acc.png")])
    assert "--plot needs matplotlib: pip install -e '.[plot]'" in msg, msg
    assert "exact accuracy" not in capsys.readouterr().out
    assert not (tmp_path / "acc.png").exists()
