"""`make demo` over seeds: how far its one run's figures can be trusted.

    python -m bench demo [--seeds 0,1,2,3,4] [--runs bench_out/demo] [--other CSV] [--blanks 30]
                         [--out bench/results/demo_seeds.json]
    python -m bench demo --fresh-clone DIR [--out bench/results/demo_fresh_clone.json]

For each seed, `python -m train.main +experiment=trm_sudoku_tiny run.seed=S` into
RUNS/trm_sudoku_tiny_seedS (wandb off; a seed whose run directory already has final.json is not
trained again), then `python -m train.evaluate`'s own function on its last checkpoint:
- on the demo's held-out test split: exact and token accuracy, and the exact accuracy after every
  ACT step;
- on grids made another way (--other, default the offline sudoku-hard-test-1k): the SOLUTIONS of
  that CSV's puzzles with --blanks cells blanked (data.sudoku_easy test_csv=, seeded), the same
  number of blanks as the demo's grids but not its generator's grids.

Writes --out: the command, machine, date and versions, every seed's figures, and the summary
(mean, min and max over seeds) that docs/training.md ("Tiny runs"), docs/evaluation.md and the
experiment's header quote (tests/test_figures.py checks them against this file).

--fresh-clone DIR times what a new user waits for instead: `git clone` of this repository's HEAD
into DIR (which must not exist), then `make .venv/bin/.installed-base` (the venv and the base
install from the package index: the install) and `make demo` (data, training, evaluation, with
an empty XLA compilation cache, as on a first run), each timed on its own; the demo's output is
kept beside --out as demo_fresh_clone.log. pip reads its usual configuration: a machine whose pip
config adds a local package index installs from it; `PIP_CONFIG_FILE=/dev/null
PIP_NO_CACHE_DIR=1` makes it download everything from PyPI (these two are recorded).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

from bench.machine import detect_device, loadavg, result_header
from train.errors import user_errors

EXPERIMENT = "trm_sudoku_tiny"
OTHER = "../shared/data/sudoku/sudoku-hard-test-1k/test.csv"


def _train(seed: int, runs: str) -> dict:
    """Train one seed (unless its final.json exists): -> {run_dir, wall_s (the command's; None
    when it was trained before), ...}."""
    name = f"{EXPERIMENT}_seed{seed}"
    run_dir = os.path.join(runs, name)
    if os.path.exists(os.path.join(run_dir, "final.json")):
        return {"run_dir": run_dir, "wall_s": None}  # trained before: only the trainer's wall
    cmd = [sys.executable, "-m", "train.main", f"+experiment={EXPERIMENT}", f"run.seed={seed}",
           f"run.name={name}", f"run.out_dir={runs}", "logging=off"]  # fmt: skip
    load, t0 = loadavg(), time.perf_counter()
    subprocess.run(cmd, check=True)
    return {"run_dir": run_dir, "wall_s": time.perf_counter() - t0, "loadavg_start": load}


def _figures(report: dict) -> dict:
    return {
        "count": report["count"],
        "exact_accuracy": report["exact_accuracy"],
        "token_accuracy": report["token_accuracy"],
        "per_step_exact_accuracy": report["per_step"]["exact_accuracy"],
    }


def _spread(values: list[float]) -> dict:
    # fsum: correctly rounded on every Python (3.12's sum() of floats is compensated, 3.11's not)
    return {"mean": math.fsum(values) / len(values), "min": min(values), "max": max(values)}


def summary(seeds: list[dict]) -> dict:
    """Mean, min and max over seeds of the final exact accuracy, of each ACT step's, and on the
    other grids."""
    out = {"n": len(seeds)}
    for where in ("test", "other"):
        if all(where in s for s in seeds):
            finals = [s[where]["exact_accuracy"] for s in seeds]
            steps = zip(*(s[where]["per_step_exact_accuracy"] for s in seeds), strict=True)
            out[where] = {
                "exact_accuracy": _spread(finals),
                "per_step_exact_accuracy": [_spread(list(v)) for v in steps],
            }
    return out


def _timed(cmd: list[str], cwd: str, log) -> dict:
    load, t0 = loadavg(), time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=log, stderr=subprocess.STDOUT)
    return {"command": shlex.join(cmd), "wall_s": time.perf_counter() - t0, "loadavg_start": load}


def fresh_clone(clone: str, out: str) -> dict:
    """The install and `make demo` of a fresh clone, timed apart (module docstring)."""
    if os.path.exists(clone):
        raise SystemExit(f"error: --fresh-clone {clone} exists; name a new directory")
    subprocess.run(["git", "clone", "-q", ".", clone], check=True)
    log_path = os.path.join(os.path.dirname(out) or ".", "demo_fresh_clone.log")
    with open(log_path, "w") as log:
        install = _timed(["make", ".venv/bin/.installed-base"], clone, log)
        log.write("=== make demo ===\n")
        log.flush()
        cache = f"DEMO_ARGS=run.compilation_cache_dir={os.path.abspath(clone)}/.xla-cache"
        demo = _timed(["make", "demo", cache], clone, log)
    with open(log_path) as f:
        demo_lines = f.read().split("=== make demo ===\n", 1)[1].count("\n")
    pip = {k: os.environ.get(k) for k in ("PIP_CONFIG_FILE", "PIP_NO_CACHE_DIR")}
    return {
        "install": {**install, "pip_environment": pip},
        "demo": {**demo, "output_lines": demo_lines},
        "log": log_path,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--fresh-clone", metavar="DIR", help="time a fresh clone's install and demo")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--runs", default="bench_out/demo", help="where the seeds' runs go")
    p.add_argument("--other", default=OTHER, help="a Sudoku CSV whose solutions are blanked")
    p.add_argument("--blanks", type=int, default=30, help="blanks per grid of --other")
    p.add_argument("--out", default=None, help="default bench/results/demo_seeds.json, or "
                   "bench/results/demo_fresh_clone.json with --fresh-clone")  # fmt: skip
    a = p.parse_args(argv)
    command = "python -m bench demo " + shlex.join(argv or sys.argv[1:])
    if a.fresh_clone:
        a.out = a.out or "bench/results/demo_fresh_clone.json"
        result = {
            **result_header("demo_fresh_clone", command, "cpu"),
            **fresh_clone(a.fresh_clone, a.out),
        }
        _write(result, a.out)
        return result
    a.out = a.out or "bench/results/demo_seeds.json"
    from data.sudoku_easy import build_easy_sudoku
    from data.sudoku_sources import read_sudoku_csv
    from train.distributed import quiet_tpu_probe
    from train.evaluate import evaluate

    quiet_tpu_probe()
    header = result_header("demo", command, detect_device())
    other = os.path.join(a.runs, f"other-{a.blanks}u")
    count = len(read_sudoku_csv(a.other))
    build_easy_sudoku(other, train=0, test=count, blanks=a.blanks, num_aug=0, test_csv=a.other)
    seeds = []
    for seed in (int(s) for s in a.seeds.split(",")):
        record = {"seed": seed, **_train(seed, a.runs)}
        with open(os.path.join(record["run_dir"], "final.json")) as f:
            final = json.load(f)
        record["step"] = final["step"]
        record["trainer_wall_s"] = final["goodput"]["wall"]  # the trainer's, from final.json
        record["test"] = _figures(evaluate(record["run_dir"]))
        record["other"] = _figures(evaluate(record["run_dir"], data=other))
        print(
            f"seed {seed}: test exact {record['test']['exact_accuracy']:.3f}, per ACT step "
            f"{record['test']['per_step_exact_accuracy']}; other {record['other']['exact_accuracy']:.3f}",
            flush=True,
        )
        seeds.append(record)
    result = {
        **header,
        "experiment": EXPERIMENT,
        "other": {
            "csv": a.other,
            "blanks": a.blanks,
            "count": count,
            "build": f"data.sudoku_easy train=0 test={count} blanks={a.blanks} num_aug=0 test_csv={a.other}",
        },  # fmt: skip
        "seeds": seeds,
        "summary": summary(seeds),
    }
    _write(result, a.out)
    return result


def _write(result: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k in ("summary", "install", "demo")}))


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
