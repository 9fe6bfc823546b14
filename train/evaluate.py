"""Evaluate a checkpoint: ours, upstream TRM's or nanoGPT's (docs/evaluation.md).

    python -m train.evaluate SOURCE [--step N] [--data PATH] [--json OUT.json] [--plot OUT.png]
                             [--extra-steps K] [--halt] [--show N] [--batch B] [overrides ...]

SOURCE is one of
  * a run directory of `python -m train.main` (config.yaml + checkpoints/): its latest checkpoint
    or --step N; TRM is evaluated with the EMA weights when the run keeps them, as upstream;
  * an upstream TRM checkpoint file (a torch state_dict, `_orig_mod.` keys ok): its config from
    the all_config.yaml upstream saves beside it, or from `+experiment=NAME` overrides;
  * a nanoGPT ckpt.pt or an HF GPT-2 .safetensors: the loss on the train and val splits of
    --data (nanoGPT's estimate_loss).
Every SOURCE is opened by train.source.open_source.

--data: a data set in the upstream puzzle layout (its test split), a Sudoku CSV (Sudoku-Extreme
columns source,question,answer,rating), or an ARC data set (test_puzzles.json beside it: pass@K
with upstream's voting over augmentations). Default: the run's own data set.

TRM numbers are upstream's (a fresh carry per batch, all halt_max_steps ACT steps, no early
halting, metrics of the last step, summed over the test split and divided by the count), computed
by the trainer's own evaluation loop (train.families.trm.task.TRMTask.run_eval), so a run's last logged eval and
this tool agree exactly on the same checkpoint, data and batch size. On top: accuracy after every
ACT step (`per_step`), --extra-steps K more steps past halt_max_steps, --halt (the Q head halts
rows, as in training), --show N boards with the prediction after each step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

import numpy as np

from train.errors import ConfigError, exit_with

log = logging.getLogger(__name__)

PASS_KS_SHOWN = (1, 2, 5, 10)


# --- data --------------------------------------------------------------------------------------
def sudoku_csv_dataset(csv_path: str, out_dir: str) -> str:
    """A Sudoku-Extreme CSV as the test split of an upstream-layout data set in `out_dir`."""
    from data.puzzle_format import write_dataset
    from data.sudoku import check_sudoku_pairs, sudoku_split
    from data.sudoku_sources import read_sudoku_csv

    records = read_sudoku_csv(csv_path)
    if not len(records):
        raise ConfigError(f"{csv_path}: no puzzles (expected rows source,question,answer,rating)")
    check_sudoku_pairs(records.questions, records.answers, f"{csv_path} ")
    split = sudoku_split(records.questions, records.answers, np.ones(len(records), np.int64))
    write_dataset(out_dir, {"test": split}, ["<blank>"], overwrite=True)
    return out_dir


# --- TRM ---------------------------------------------------------------------------------------
def evaluate_trm(task, state, data: str, *, trained_on=None, extra_steps=0, halt=False, show=0,
                 batch=None, save_dir=None, progress=False) -> dict:  # fmt: skip
    """The evaluation report of a TRM state on `data`'s test split (see the module docstring)."""
    from data.arc_eval import ARCEvaluator
    from train.mesh import check_batch_divisible

    if extra_steps < 0:
        raise ConfigError(f"--extra-steps {extra_steps}: expected >= 0")
    task.check_eval_data(data, trained_on)
    if batch is not None:
        if batch <= 0:
            raise ConfigError(f"--batch {batch}: expected a positive number of puzzles")
        check_batch_divisible(task.mesh, task.cfg.mesh.rules, {"--batch": batch})
    is_arc = os.path.isfile(os.path.join(data, "test_puzzles.json"))
    evaluator = ARCEvaluator(data) if is_arc else None  # one checkpoint alone: fresh votes
    res = task.run_eval(
        state,
        data_dir=data,
        batch_size=batch,
        extra_steps=extra_steps,
        halt=halt,
        evaluator=evaluator,
        progress=progress,
    )
    m = res["metrics"]
    n = task.model_cfg.halt_max_steps
    out = {
        "exact_accuracy": m["exact_accuracy"],
        "token_accuracy": m["accuracy"],
        "count": int(res["count"]),
        "lm_loss": m["lm_loss"],
        "q_halt_accuracy": m["q_halt_accuracy"],
        "q_halt_loss": m["q_halt_loss"],
        "mean_steps": m["steps"],
        "halt_max_steps": n,
        "steps_run": n + extra_steps,
        "extra_steps": extra_steps,
        "halt": halt,
        "per_step": {
            "exact_accuracy": res["per_step"]["exact_accuracy"],
            "token_accuracy": res["per_step"]["accuracy"],
        },
        # the trainer's own metric names (metrics.jsonl), for a side-by-side check
        "metrics": {f"eval/all/{k}": v for k, v in m.items()},
    }
    if evaluator is not None:
        arc = evaluator.result(save_dir) or {}
        for k, v in arc.items():  # "ARC/pass@K" (upstream's name) and plain "pass@K"
            out[k] = float(v)
            out[k.split("/")[-1]] = float(v)
    if show:
        out["show"] = show_boards(task, state, data, show, extra_steps)
    return out


def show_boards(task, state, data: str, n: int, extra_steps: int = 0):
    """Boards of the first `n` test puzzles with the prediction after every ACT step."""
    import functools

    import jax

    from data.puzzle_source import PuzzleTestDataset
    from models.trm.eval_step import eval_step
    from train.families.trm.show import puzzle_boards

    ds = PuzzleTestDataset(data, global_batch_size=max(n, 1), process_index=0, process_count=1)
    rows = ds[0]
    k = int(rows["mask"].sum())
    batch = {key: rows[key][:k] for key in ("inputs", "labels", "puzzle_identifiers")}
    fn = jax.jit(
        functools.partial(
            eval_step, task.graphdef, config=task.optim, extra_steps=extra_steps, trace=True
        )
    )
    with jax.set_mesh(task.mesh):
        out = jax.device_get(fn(state["train"], batch))
    m = task.model_cfg
    return puzzle_boards(
        batch["inputs"], batch["labels"], out["step_preds"], out["step_halts"],
        m.seq_len, m.vocab_size,
    )  # fmt: skip


# --- nanoGPT -------------------------------------------------------------------------------------
def evaluate_gpt(task, state, data: str) -> dict:
    """nanoGPT's estimate_loss on the train and val splits of `data` (the trainer's own)."""
    task.check_eval_data(data)
    m = task.run_eval(state, data)
    return {"train_loss": m["eval/train_loss"], "val_loss": m["eval/val_loss"], "metrics": m}


# --- the library entry -------------------------------------------------------------------------
def evaluate(source: str, *, step: int | None = None, data: str | None = None,
             extra_steps: int = 0, halt: bool = False, show: int = 0, batch: int | None = None,
             overrides=(), save_dir: str | None = None, progress: bool = False) -> dict:  # fmt: skip
    """The report `python -m train.evaluate` prints and writes (--json): see the module
    docstring. Raises ConfigError (one line) on bad input."""
    import jax

    from train.source import open_source

    with tempfile.TemporaryDirectory() as tmp:
        if data is not None and os.path.isfile(data) and data.endswith(".csv"):
            data = sudoku_csv_dataset(data, os.path.join(tmp, "sudoku_csv"))
        src = open_source(source, step=step, data=data, overrides=overrides)
        task, state = src.task, src.state
        report = {"source": source, "kind": src.kind}
        if src.kind == "run":
            report["step"] = src.step
        own = src.cfg.data.get("path") or None  # the run's (or the file's config's) data set
        data = data or own
        if data is None or not os.path.exists(data):
            raise ConfigError(f"data.path={own!r} is not on disk; pass --data PATH")
        with jax.set_mesh(task.mesh):
            if src.cfg.task == "gpt":
                if extra_steps or halt or show:
                    raise ConfigError("--extra-steps, --halt and --show are TRM options")
                report.update(data=data, **evaluate_gpt(task, state, data))
                return report
            report["data"] = data
            report.update(
                evaluate_trm(
                    task, state, data, trained_on=src.trained_on,
                    extra_steps=extra_steps, halt=halt, show=show, batch=batch,
                    save_dir=save_dir, progress=progress,
                )
            )  # fmt: skip
    return report


# --- output --------------------------------------------------------------------------------------
def format_table(r: dict) -> str:
    """The report as the table `main` prints."""
    lines = [
        f"source: {r['source']} ({r['kind']}" + (f", step {r['step']})" if "step" in r else ")")
    ]
    lines.append(f"data:   {r.get('data')}")
    if "val_loss" in r:
        lines += [f"train loss {r['train_loss']:.4f}", f"val loss   {r['val_loss']:.4f}"]
        return "\n".join(lines)
    mode = "Q-head halting on" if r["halt"] else "no halting (upstream)"
    lines.append(
        f"{r['count']} puzzles, {r['steps_run']} ACT steps (halt_max_steps {r['halt_max_steps']}"
        f" + {r['extra_steps']} extra), {mode}"
    )
    lines.append(f"exact accuracy   {r['exact_accuracy']:.4f}")
    lines.append(f"token accuracy   {r['token_accuracy']:.4f}")
    lines.append(f"q-halt accuracy  {r['q_halt_accuracy']:.4f}")
    lines.append(f"mean steps       {r['mean_steps']:.2f}")
    lines.append(f"lm loss          {r['lm_loss']:.4f}")
    for k in PASS_KS_SHOWN:
        if f"pass@{k}" in r:
            lines.append(f"pass@{k:<11d}{r[f'pass@{k}']:.4f}")
    lines.append("ACT step   exact   token")
    ps = r["per_step"]
    for i, (e, t) in enumerate(zip(ps["exact_accuracy"], ps["token_accuracy"])):
        mark = "  <- halt_max_steps" if i + 1 == r["halt_max_steps"] and r["extra_steps"] else ""
        lines.append(f"{i + 1:8d}  {e:.4f}  {t:.4f}{mark}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m train.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "source",
        help="run directory, upstream TRM checkpoint, nanoGPT ckpt.pt or HF GPT-2 .safetensors",
    )
    p.add_argument("--step", type=int, default=None, help="run directory: this checkpoint step")
    p.add_argument("--data", default=None, help="data set dir, Sudoku CSV, or ARC data set")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the report as JSON")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="accuracy vs ACT step")
    p.add_argument("--extra-steps", type=int, default=0, metavar="K",
                   help="K more ACT steps past halt_max_steps")  # fmt: skip
    p.add_argument("--halt", action="store_true", help="Q-head halting on (as in training)")
    p.add_argument("--show", type=int, default=0, metavar="N",
                   help="print N puzzles with the prediction after every ACT step")  # fmt: skip
    p.add_argument("--batch", type=int, default=None, metavar="B", help="evaluation batch size")
    p.add_argument("overrides", nargs="*", help="config overrides (key=value, +experiment=NAME)")
    return p


def main(argv=None) -> dict:
    args = _parser().parse_intermixed_args(argv)
    from train.distributed import quiet_tpu_probe

    quiet_tpu_probe()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    save_dir = os.path.dirname(os.path.abspath(args.json)) if args.json else None
    try:
        report = evaluate(
            args.source, step=args.step, data=args.data, extra_steps=args.extra_steps,
            halt=args.halt, show=args.show, batch=args.batch, overrides=args.overrides,
            save_dir=save_dir, progress=sys.stderr.isatty(),
        )  # fmt: skip
    except ConfigError as e:
        exit_with(e)
    boards = report.pop("show", None)
    print(format_table(report))
    if boards:
        from train.families.trm.show import render_text

        print()
        print(render_text(boards))
    if args.plot and "per_step" in report:
        _plot(report, boards, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return report


def _plot(report: dict, boards, path: str) -> None:
    from train.families.trm.show import save_accuracy_plot, save_gif, save_png

    save_accuracy_plot(report["per_step"], report["halt_max_steps"], path, report["source"])
    print(f"wrote {path}")
    if boards:
        stem = os.path.splitext(path)[0]
        print(f"wrote {save_png(boards, stem + '_show.png')}")
        print(f"wrote {save_gif(boards, stem + '_show.gif')}")


if __name__ == "__main__":
    main()
