"""Evaluate a checkpoint: ours, upstream TRM's or nanoGPT's (docs/evaluation.md).

    python -m train.evaluate SOURCE [--step N] [--data PATH] [--json OUT.json] [--plot OUT.png]
                             [--extra-steps K] [--halt] [--show N] [--batch B] [overrides ...]

SOURCE is one of
  * a run directory of `python -m train.main` (config.yaml + checkpoints/): its latest checkpoint
    or --step N; TRM is evaluated with the EMA weights when the run keeps them, as upstream;
  * an upstream TRM checkpoint file (a torch state_dict, `_orig_mod.` keys ok): its config from
    the all_config.yaml upstream saves beside it, or from `+experiment=NAME` overrides;
  * a nanoGPT ckpt.pt: the loss on the train and val splits of --data (nanoGPT's estimate_loss).

--data: a data set in the upstream puzzle layout (its test split), a Sudoku CSV (Sudoku-Extreme
columns source,question,answer,rating), or an ARC data set (test_puzzles.json beside it: pass@K
with upstream's voting over augmentations). Default: the run's own data set.

TRM numbers are upstream's (a fresh carry per batch, all halt_max_steps ACT steps, no early
halting, metrics of the last step, summed over the test split and divided by the count), computed
by the trainer's own evaluation (train.trm_task.TRMTask.run_eval), so a run's last logged eval and
this tool agree exactly on the same checkpoint, data and batch size. On top: accuracy after every
ACT step (`per_step`), --extra-steps K more steps past halt_max_steps, --halt (the Q head halts
rows, as in training), --show N boards with the prediction after each step.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile

import numpy as np

log = logging.getLogger(__name__)

PASS_KS_SHOWN = (1, 2, 5, 10)


class EvalError(ValueError):
    """Bad input to the evaluation: one line naming the file / field and what was expected."""


# --- sources ---------------------------------------------------------------------------------
def _source_kind(source: str) -> str:
    if os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, "config.yaml")):
            raise EvalError(
                f"{source}: a directory without config.yaml; expected a run directory of "
                "python -m train.main (config.yaml + checkpoints/)"
            )
        return "run"
    if not os.path.isfile(source):
        raise EvalError(f"{source}: no such file or run directory")
    return "file"


def _restore_run(run_dir: str, step: int | None, data: str | None, overrides):
    """(cfg, task, state, step) of a run directory's checkpoint (task sizes from the run's data
    set; if that is gone, from --data's test split)."""
    from omegaconf import OmegaConf

    from train import families
    from train import jit as jit_lib
    from train.checkpoint import Checkpointer
    from train.compose import load_run_config
    from train.mesh import make_mesh

    with open(os.path.join(run_dir, "config.yaml")) as f:
        cfg = load_run_config(f.read())
    if overrides:
        _merge_overrides(cfg, overrides)
    families.enable_x64_if_needed(cfg)
    need_data = _sizes_from_data(cfg, data)
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"), cfg.checkpoint)
    try:
        steps = sorted(ckpt.manager.all_steps())
        if not steps:
            raise EvalError(f"{run_dir}/checkpoints: no checkpoint saved")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise EvalError(f"{run_dir}: --step {step} not saved; checkpoints: {steps}")
        task = families.make_task(cfg, make_mesh(cfg.mesh), need_data=need_data)
        abstract = jit_lib.with_shardings(task.abstract_state, task.state_shardings)
        try:
            state, _ = ckpt.restore(step, abstract)
        except ValueError as e:  # Orbax: a shape / dtype that does not fit
            raise EvalError(
                f"{run_dir}/checkpoints/{step}: does not fit the config "
                f"({_one_line(e)}); model: {OmegaConf.to_container(cfg.model)}"
            ) from e
    finally:
        ckpt.close()
    return cfg, task, state, step


def _merge_overrides(cfg, overrides) -> None:
    """key=value overrides onto a run's saved config; `mesh=NAME` swaps in configs/mesh/NAME.yaml
    (e.g. a v4-64 run evaluated on one machine: mesh=cpu)."""
    from omegaconf import OmegaConf

    from train.compose import CONFIG_DIR

    bad = [o for o in overrides if "=" not in o or o.startswith("+")]
    if bad:
        raise EvalError(f"overrides {bad}: a run directory takes key=value overrides only")
    OmegaConf.set_struct(cfg, False)
    for o in overrides:
        key, value = o.split("=", 1)
        if key == "mesh":
            path = os.path.join(CONFIG_DIR, "mesh", f"{value}.yaml")
            if not os.path.isfile(path):
                raise EvalError(f"mesh={value}: no {path}")
            cfg.mesh = OmegaConf.merge(cfg.mesh, OmegaConf.load(path))
        else:
            cfg.merge_with(OmegaConf.from_dotlist([o]))
    OmegaConf.set_struct(cfg, True)


def _sizes_from_data(cfg, data: str | None) -> bool:
    """True when the run's own data set is on disk (its train metadata sizes the model, as in
    training); otherwise the sizes come from --data's test split and need_data is False."""
    from omegaconf import open_dict

    own = cfg.data.get("path", "")
    if cfg.task != "trm" or (own and os.path.isfile(os.path.join(own, "train", "dataset.json"))):
        return True
    if data is None:
        raise EvalError(
            f"data.path={own!r} of the run is not on disk; pass --data PATH (its test split)"
        )
    meta = _test_metadata(data)
    with open_dict(cfg.data):
        cfg.data.seq_len = meta.seq_len
        cfg.data.vocab_size = meta.vocab_size
        cfg.data.num_puzzle_identifiers = meta.num_puzzle_identifiers
    return False


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) < 300 else text[:300] + " ..."


# upstream arch names (config/arch/*.yaml `name`) -> TRMConfig.arch
_UPSTREAM_ARCH = {
    "trm_singlez": "trm_singlez",
    "trm_hier6": "trm_hier6",
    "transformers_baseline": "transformers_baseline",
    "hrm": "hrm",
    "trm": "trm",
}
_UPSTREAM_MODEL_KEYS = (
    "H_cycles", "L_cycles", "H_layers", "L_layers", "hidden_size", "expansion", "num_heads",
    "pos_encodings", "rms_norm_eps", "rope_theta", "halt_max_steps", "halt_exploration_prob",
    "forward_dtype", "mlp_t", "puzzle_emb_ndim", "puzzle_emb_len", "no_ACT_continue",
    "act_enabled", "act_inference",
)  # fmt: skip


def upstream_overrides(all_config: dict) -> list[str]:
    """Our Hydra overrides for the run an upstream all_config.yaml describes (model from `arch`,
    loss type, batch size, EMA, data_paths[0], the ARC evaluator)."""
    arch = dict(all_config.get("arch") or {})
    module = str(arch.get("name", "recursive_reasoning.trm@")).split("@")[0].split(".")[-1]
    if module not in _UPSTREAM_ARCH:
        raise EvalError(f"all_config.yaml: arch.name={arch.get('name')!r} is not a known TRM arch")
    out = [
        "task=trm",
        "model=trm",
        "optim=trm",
        "data=sudoku",
        f"model.arch={_UPSTREAM_ARCH[module]}",
    ]
    out += [f"model.{k}={arch[k]}" for k in _UPSTREAM_MODEL_KEYS if k in arch]
    loss = (arch.get("loss") or {}).get("loss_type")
    if loss:
        out.append(f"optim.loss_type={loss}")
    if "global_batch_size" in all_config:
        out.append(f"trainer.global_batch_size={int(all_config['global_batch_size'])}")
    if "ema" in all_config:
        out.append(f"optim.ema={bool(all_config['ema'])}")
    paths = all_config.get("data_paths_test") or all_config.get("data_paths") or []
    if paths:
        out.append(f"data.path={paths[0]}")
    if any("arc" in str(e.get("name", "")).lower() for e in all_config.get("evaluators") or []):
        out.append("+data.evaluator=arc")
    return out + ["run.name=upstream_eval", "trainer.epochs=1", "data.eval_interval_epochs=1"]


def _upstream_trm(path: str, state_dict: dict, data: str | None, overrides):
    """(cfg, task, state) for an upstream TRM checkpoint: config from all_config.yaml beside it
    (then the overrides) or the overrides alone (+experiment=NAME); vocab and puzzle identifiers
    from the checkpoint's own tables, seq_len from the data."""
    import yaml
    from omegaconf import open_dict

    from models.state_dict import strip_prefix
    from models.trm.params import PUZZLE_KEY
    from train import families
    from train.compose import load_config
    from train.mesh import make_mesh

    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "all_config.yaml")
    base = []
    if os.path.isfile(beside):
        with open(beside) as f:
            base = upstream_overrides(yaml.safe_load(f) or {})
    elif not any(o.startswith("+experiment=") for o in overrides):
        raise EvalError(
            f"{path}: no all_config.yaml beside it; pass the run's config as overrides, "
            "e.g. +experiment=trm_sudoku (and model.* / data.path=...)"
        )
    given = [o.split("=", 1)[1] for o in base + list(overrides) if o.startswith("data.path=")]
    trained_on = given[-1] if given else None  # the data set the checkpoint's run used
    if data is not None:
        overrides = [*overrides, f"data.path={data}"]
    cfg = load_config(base + list(overrides))
    sd = strip_prefix(state_dict, "_orig_mod.")
    vocab = sd.get("model.inner.embed_tokens.embedding_weight")
    table = sd.get(PUZZLE_KEY)
    meta = _test_metadata(cfg.data.path)
    with open_dict(cfg.data):
        cfg.data.seq_len = meta.seq_len
        cfg.data.vocab_size = int(vocab.shape[0]) if vocab is not None else meta.vocab_size
        cfg.data.num_puzzle_identifiers = (
            int(table.shape[0]) if table is not None else meta.num_puzzle_identifiers
        )
    families.enable_x64_if_needed(cfg)
    task = families.make_task(cfg, make_mesh(cfg.mesh), need_data=False)
    try:
        state = task.import_weights(task.create_state(), path)
    except (KeyError, ValueError) as e:
        raise EvalError(f"{path}: does not fit the config ({_one_line(e)})") from e
    return cfg, task, state, trained_on


# --- data --------------------------------------------------------------------------------------
def _test_metadata(data: str):
    from data.puzzle_format import load_metadata

    if not os.path.isfile(os.path.join(data, "test", "dataset.json")):
        raise EvalError(
            f"--data {data}: no test/dataset.json; expected a data set in the upstream layout "
            "(python -m data.sudoku / data.maze / data.arc), or a Sudoku CSV file"
        )
    return load_metadata(data, "test")


def sudoku_csv_dataset(csv_path: str, out_dir: str) -> str:
    """A Sudoku-Extreme CSV as the test split of an upstream-layout data set in `out_dir`."""
    from data.puzzle_format import write_dataset
    from data.sudoku import check_sudoku_pairs, sudoku_split
    from data.sudoku_sources import read_sudoku_csv

    records = read_sudoku_csv(csv_path)
    if not len(records):
        raise EvalError(f"{csv_path}: no puzzles (expected rows source,question,answer,rating)")
    check_sudoku_pairs(records.questions, records.answers, f"{csv_path} ")
    split = sudoku_split(records.questions, records.answers, np.ones(len(records), np.int64))
    write_dataset(out_dir, {"test": split}, ["<blank>"], overwrite=True)
    return out_dir


def _check_data_fits(task, data: str, run_data: str | None) -> None:
    """The test split's seq_len, vocab and puzzle identifiers fit the model; an ARC set's
    identifiers.json is the run's own (puzzle identifiers index the trained embedding table)."""
    meta, m = _test_metadata(data), task.model_cfg
    where = os.path.join(data, "test", "dataset.json")
    for key, have, limit in (
        ("seq_len", meta.seq_len, m.seq_len),
        ("vocab_size", meta.vocab_size, m.vocab_size),
        ("num_puzzle_identifiers", meta.num_puzzle_identifiers, m.num_puzzle_identifiers),
    ):
        if (have != limit) if key == "seq_len" else (have > limit):
            raise EvalError(f"--data {where}: {key}={have}, but the model has {key}={limit}")
    mine, theirs = (os.path.join(p, "identifiers.json") if p else "" for p in (data, run_data))
    if (
        m.num_puzzle_identifiers > 1
        and run_data
        and os.path.abspath(data) != os.path.abspath(run_data)
        and os.path.isdir(run_data)
        and os.path.isfile(mine)
        and os.path.isfile(theirs)
    ):
        with open(mine) as f, open(theirs) as g:
            if json.load(f) != json.load(g):
                raise EvalError(
                    f"--data {mine} differs from the run's {theirs}: puzzle identifiers index "
                    "the trained puzzle embeddings, so evaluate on the data set the run was "
                    "trained with (docs/evaluation.md, ARC puzzle identifiers)"
                )


# --- TRM ---------------------------------------------------------------------------------------
def evaluate_trm(task, state, data: str, *, run_data=None, extra_steps=0, halt=False, show=0,
                 batch=None, save_dir=None, progress=False) -> dict:  # fmt: skip
    """The evaluation report of a TRM state on `data`'s test split (see the module docstring)."""
    from data.arc_eval import ARCEvaluator

    if extra_steps < 0:
        raise EvalError(f"--extra-steps {extra_steps}: expected >= 0")
    _check_data_fits(task, data, run_data)
    if batch is not None:
        _check_batch(task, batch)
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


def _check_batch(task, batch: int) -> None:
    from train.mesh import logical_to_mesh

    axes = logical_to_mesh(task.cfg.mesh.rules, "batch")
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    parts = math.prod(task.mesh.shape[a] for a in axes)
    if batch <= 0 or batch % parts:
        raise EvalError(f"--batch {batch}: expected a positive multiple of {parts} (data shards)")


def show_boards(task, state, data: str, n: int, extra_steps: int = 0):
    """Boards of the first `n` test puzzles with the prediction after every ACT step."""
    import functools

    import jax

    from data.puzzle_source import PuzzleTestDataset
    from train.show import puzzle_boards

    ds = PuzzleTestDataset(data, global_batch_size=max(n, 1), process_index=0, process_count=1)
    rows = ds[0]
    k = int(rows["mask"].sum())
    batch = {key: rows[key][:k] for key in ("inputs", "labels", "puzzle_identifiers")}
    fn = jax.jit(functools.partial(task.eval_rollout, extra_steps=extra_steps, trace=True))
    with jax.set_mesh(task.mesh):
        out = jax.device_get(fn(state["train"], batch))
    m = task.model_cfg
    return puzzle_boards(
        batch["inputs"], batch["labels"], out["step_preds"], out["step_halts"],
        m.seq_len, m.vocab_size,
    )  # fmt: skip


# --- nanoGPT -------------------------------------------------------------------------------------
def evaluate_gpt(task, state) -> dict:
    """nanoGPT's estimate_loss on the train and val splits (the trainer's GPT evaluation)."""
    from omegaconf import open_dict

    with open_dict(task.cfg.data):
        task.cfg.data.sample_tokens = 0
    m = task.evaluate(state, 0)
    return {"train_loss": m["eval/train_loss"], "val_loss": m["eval/val_loss"], "metrics": m}


def _nanogpt(path: str, ckpt: dict, data: str | None, overrides):
    from train import families
    from train.compose import load_config
    from train.mesh import make_mesh

    if data is None:
        raise EvalError(f"{path}: a nanoGPT checkpoint needs --data DIR (train.bin, val.bin)")
    args = ckpt.get("model_args") or {}
    base = [] if any(o.startswith("+experiment=") for o in overrides) else [
        "+experiment=gpt_shakespeare_char"
    ]  # fmt: skip
    model = [f"model.{k}={args[k]}" for k in ("n_layer", "n_head", "n_embd", "block_size", "bias")
             if k in args]  # fmt: skip
    cfg = load_config(
        base + model + ["model.dropout=0.0", "run.name=nanogpt_eval", f"data.path={data}"]
        + list(overrides)
    )  # fmt: skip
    families.enable_x64_if_needed(cfg)
    task = families.make_task(cfg, make_mesh(cfg.mesh))
    if "vocab_size" in args and int(args["vocab_size"]) != task.model_cfg.vocab_size:
        raise EvalError(
            f"{path}: model_args vocab_size={args['vocab_size']}, but --data {data} has "
            f"vocab_size={task.model_cfg.vocab_size}"
        )
    try:
        state = task.import_weights(task.create_state(), path)
    except (KeyError, ValueError) as e:
        raise EvalError(f"{path}: does not fit the config ({_one_line(e)})") from e
    return cfg, task, state


# --- the library entry -------------------------------------------------------------------------
def evaluate(source: str, *, step: int | None = None, data: str | None = None,
             extra_steps: int = 0, halt: bool = False, show: int = 0, batch: int | None = None,
             overrides=(), save_dir: str | None = None, progress: bool = False) -> dict:  # fmt: skip
    """The report `python -m train.evaluate` prints and writes (--json): see the module
    docstring. Raises EvalError (one line) on bad input."""
    import jax

    overrides, data_arg = list(overrides), data
    with tempfile.TemporaryDirectory() as tmp:
        if data is not None and os.path.isfile(data) and data.endswith(".csv"):
            data = sudoku_csv_dataset(data, os.path.join(tmp, "sudoku_csv"))
        if data is not None and not os.path.exists(data):
            raise EvalError(f"--data {data}: no such file or directory")
        kind = _source_kind(source)
        report = {"source": source}
        trained_on = None
        if kind == "run":
            cfg, task, state, step = _restore_run(source, step, data, overrides)
            trained_on = cfg.data.get("path") or None
            report.update(kind="run", step=int(step))
        else:
            if step is not None:
                raise EvalError(
                    f"--step {step}: only a run directory has steps ({source} is a file)"
                )
            from models.state_dict import load_file

            loaded = load_file(source)
            if "model_args" in loaded:
                cfg, task, state = _nanogpt(source, loaded, data, overrides)
                report.update(kind="nanogpt")
            else:
                cfg, task, state, trained_on = _upstream_trm(source, loaded, data, overrides)
                report.update(kind="upstream_trm")
        with jax.set_mesh(task.mesh):
            if cfg.task == "gpt":
                if extra_steps or halt or show:
                    raise EvalError(
                        "--extra-steps, --halt and --show are TRM options (a GPT source)"
                    )
                report.update(data=cfg.data.path, **evaluate_gpt(task, state))
                return report
            run_data = cfg.data.get("path") or None
            report["data"] = data_arg or run_data
            report.update(
                evaluate_trm(
                    task, state, data or run_data, run_data=trained_on,
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
    p.add_argument("source", help="run directory, upstream TRM checkpoint file, or nanoGPT ckpt.pt")
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
    except EvalError as e:
        raise SystemExit(f"error: {e}") from None
    boards = report.pop("show", None)
    print(format_table(report))
    if boards:
        from train.show import render_text

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
    from train.show import save_accuracy_plot, save_gif, save_png

    save_accuracy_plot(report["per_step"], report["halt_max_steps"], path, report["source"])
    print(f"wrote {path}")
    if boards:
        stem = os.path.splitext(path)[0]
        print(f"wrote {save_png(boards, stem + '_show.png')}")
        print(f"wrote {save_gif(boards, stem + '_show.gif')}")


if __name__ == "__main__":
    main()
