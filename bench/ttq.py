"""Time to quality: wall time until a run reaches a target, JAX step vs the PyTorch reference.

    python -m bench ttq [--configs gpt_shakespeare_char_tiny,trm_sudoku_tiny]
                        [--impls jax,torch_eager] [--target X] [--metric M] [--max-steps N]
                        [--eval-interval K] [--data-dir DIR] [--out DIR]

Both sides train on the SAME batches (one seeded numpy stream per worker) with the experiment's
schedule and optimiser, are evaluated on the same fixed data every K steps (GPT `val_loss`; TRM
`exact_accuracy` or `accuracy` of the EMA model over halt_max_steps ACT steps, normalised by the
trainer's own rule), interleaved in chunks, and stop at the first eval that reaches the target
(or --max-steps, default the experiment's schedule). Each side's clock counts its own work,
compiles included. The data set is built as the trainer builds it when missing.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from bench import configs as bench_configs
from bench.machine import detect_device, loadavg, result_header
from bench.speed import load_average, table_head
from bench.worker import Worker, WorkerError, record_error
from train.errors import ConfigError, OneLineParser

JSON_NAME = "ttq.json"


def prepare_data(rc: dict, data_dir: str | None, input_path: str | None) -> str:
    """The data directory for a resolved config, built if missing (as the trainer would)."""
    d = rc["trainer_cfg"].get("data") or {}
    path = data_dir or d.get("path") or f"data_out/{rc['config']}"
    if rc["family"] == "gpt":
        if not os.path.exists(os.path.join(path, "train.bin")):
            from data.shakespeare_char import build

            build(path, input_path=input_path or d.get("input") or None)
        return path
    if not os.path.exists(os.path.join(path, "train", "dataset.json")):
        import importlib

        builder, args = d.get("build"), list(d.get("build_args") or [])
        if not builder:
            raise ConfigError(f"bench ttq: {path} has no puzzle data and its config no builder")
        module = builder if "." in builder else f"data.{builder}"  # as train/families/trm/task.py
        importlib.import_module(module).main(args + ["--output-dir", path])
    return path


# ----------------------------------------------------------------------------------------------
# Driver


def _eval_means(ev: dict) -> dict:
    """A worker's eval sums as metric values: GPT's mean loss over the batches (val_loss), TRM's
    sums through the trainer's normalisation (every key / count: rows that halted with labels)."""
    sums = ev["sums"]
    if "loss" in sums:
        return {"val_loss": sums["loss"] / sums["count"], "eval_s": ev["eval_s"]}
    from models.trm.losses import normalize_metrics  # lazy: the parent never needs jax otherwise

    means = normalize_metrics(sums, mode="eval")
    return {"accuracy": float(means["accuracy"]), "exact_accuracy": float(means["exact_accuracy"]),
            "eval_s": ev["eval_s"]}  # fmt: skip


def ttq_config(cfg, impls, *, data_dir, input_path, target, metric, max_steps, eval_interval,
               eval_iters, eval_examples, seed, threads, timeout_s, log=print) -> dict:  # fmt: skip
    rc = bench_configs.resolve(cfg, seed=seed)
    t = rc["ttq"]
    metric = metric or t.get("metric", "val_loss" if rc["family"] == "gpt" else "exact_accuracy")
    target = target if target is not None else t.get("target")
    schedule = rc["optim"].get("total_steps") or rc["optim"].get("max_iters") or 1000
    max_steps = max_steps or t.get("max_steps", schedule)
    eval_interval = eval_interval or t.get("eval_interval", 100)
    lower = metric.endswith("loss")
    record = {"config": cfg.name, "config_source": rc["source"], "metric": metric,
              "target": target, "max_steps": max_steps, "eval_interval": eval_interval,
              "data_dir": prepare_data(rc, data_dir, input_path), "impls": {}}  # fmt: skip
    workers = {}
    for impl in impls:
        spec = {"impl": impl, "device": detect_device(), "resolved": rc, "seed": seed,
                "threads": threads, "data_dir": record["data_dir"],
                "eval_iters": eval_iters or t.get("eval_iters", 20), "eval_examples": eval_examples}  # fmt: skip
        res = record["impls"][impl] = {"status": "ok", "curve": [], "busy_s": 0.0, "steps": 0,
                                       "reached": False}  # fmt: skip
        try:
            workers[impl] = Worker(spec, timeout_s)
            res["info"] = workers[impl].info
        except WorkerError as e:
            record_error(res, e)
    active = dict(workers)
    while active:
        for name in list(active):
            w, res = active[name], record["impls"][name]
            try:
                n = min(eval_interval, max_steps - res["steps"])
                out = w.call("run", n)
                ev = _eval_means(w.call("eval"))
            except WorkerError as e:
                record_error(res, e)
                active.pop(name).close()
                continue
            res["steps"] += n
            res["busy_s"] += out["seconds"] + ev["eval_s"]
            res["curve"].append({"step": res["steps"], "wall_s": res["busy_s"],
                                 "train_loss": out["loss"], **ev})  # fmt: skip
            log(f"[{cfg.name}] {name} step {res['steps']}: {metric}={ev[metric]:.4f} "
                f"(wall {res['busy_s']:.1f} s)")  # fmt: skip
            if target is not None and (ev[metric] <= target if lower else ev[metric] >= target):
                res.update(reached=True, steps_to_target=res["steps"],
                           wall_to_target_s=res["busy_s"])  # fmt: skip
                active.pop(name)
            elif res["steps"] >= max_steps:
                active.pop(name)
    for name, w in workers.items():
        try:
            record["impls"][name]["memory"] = w.call("stats")
        except (WorkerError, OSError):  # a worker closed after its failure
            pass
        w.close()
    a, b = record["impls"].get("jax", {}), record["impls"].get("torch_eager", {})
    if a.get("reached") and b.get("reached"):
        record["ratio_wall_jax/torch_eager"] = a["wall_to_target_s"] / b["wall_to_target_s"]
    return record


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = OneLineParser(prog="python -m bench ttq", description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="gpt_shakespeare_char_tiny,trm_sudoku_tiny")
    p.add_argument("--impls", default="jax,torch_eager")
    # --metric/--target/--data-dir apply when ONE config is given; else each config's defaults
    p.add_argument("--metric", default=None, help="val_loss | exact_accuracy | accuracy")
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--eval-interval", type=int, default=None)
    p.add_argument("--eval-iters", type=int, default=None, help="GPT: val batches per eval")
    p.add_argument("--eval-examples", type=int, default=256, help="TRM: test puzzles per eval")
    p.add_argument("--data-dir", default=None, help="default: the experiment's data.path")
    p.add_argument("--input", default=None, help="GPT: local input.txt for the char data set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", default="bench_out")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    cfgs = [bench_configs.get(n) for n in names]
    one = len(names) == 1
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python -m bench ttq " + " ".join(shlex.quote(x) for x in argv)
    result = {**result_header("ttq", command, detect_device()), "results": []}
    for cfg in cfgs:
        result["results"].append(ttq_config(
            cfg, [i.strip() for i in a.impls.split(",")], data_dir=a.data_dir if one else None,
            input_path=a.input, target=a.target if one else None,
            metric=a.metric if one else None, max_steps=a.max_steps,
            eval_interval=a.eval_interval, eval_iters=a.eval_iters,
            eval_examples=a.eval_examples, seed=a.seed, threads=a.threads, timeout_s=a.timeout))  # fmt: skip
    result["loadavg_end"] = loadavg()
    (out_dir / JSON_NAME).write_text(json.dumps(result, indent=1, default=str))
    print(ttq_markdown(result))
    print(f"wrote {out_dir / JSON_NAME}")
    return result


def ttq_markdown(result: dict) -> str:
    """What a time-to-quality record says: one row per implementation and config."""
    lines = [
        f"`{result['command']}` at {result['started_utc']}; {load_average(result)}.",
        *table_head("config|impl|metric (target)|reached|steps|wall s (incl. compile)|final value"),
    ]
    for rec in result["results"]:
        for impl, res in rec["impls"].items():
            if res["status"] != "ok":
                lines.append(f"| {rec['config']} | {impl} | error: {res.get('error')} | | | | |")
                continue
            wall = res.get("wall_to_target_s", res["busy_s"])
            final = res["curve"][-1][rec["metric"]] if res["curve"] else float("nan")
            lines.append(
                f"| {rec['config']} | {impl} | {rec['metric']} ({rec['target']}) "
                f"| {'yes' if res['reached'] else 'no'} | {res['steps']} | {wall:.1f} | {final:.4f} |"
            )
    return "\n".join(lines)
