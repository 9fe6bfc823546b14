"""`make demo` over seeds: how far its one run's figures can be trusted.

    python -m bench demo [--seeds 0,1,2,3,4] [--runs bench_out/demo] [--other CSV] [--blanks 30]
                         [--out bench/results/demo_seeds.json]

Each seed trains `+experiment=trm_sudoku_tiny run.seed=S` into RUNS (a run with its final.json is
kept), then train.evaluate's own function scores its last checkpoint on the demo's test split
(exact and token accuracy, and the exact accuracy after every ACT step) and on grids made another
way: the SOLUTIONS of --other's puzzles (default the offline sudoku-hard-test-1k) with --blanks of
each puzzle's own blank cells blanked again (data.sudoku_easy test_csv=), `other` at random,
`published` as printed puzzles are (pattern=published). --out holds every seed's figures and
their mean, min and max, which the docs quote (tests/test_figures.py checks them).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time

from bench.machine import detect_device, loadavg, result_header
from train.errors import OneLineParser

EXPERIMENT = "trm_sudoku_tiny"
OTHER = "../shared/data/sudoku/sudoku-hard-test-1k/test.csv"
OTHER_SETS = {"other": "uniform", "published": "published"}  # --other's grids, blanked two ways


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
    other grids (OTHER_SETS)."""
    out = {"n": len(seeds)}
    for where in ("test", *OTHER_SETS):
        if all(where in s for s in seeds):
            finals = [s[where]["exact_accuracy"] for s in seeds]
            steps = zip(*(s[where]["per_step_exact_accuracy"] for s in seeds), strict=True)
            out[where] = {
                "exact_accuracy": _spread(finals),
                "per_step_exact_accuracy": [_spread(list(v)) for v in steps],
            }
    return out


def main(argv: list[str] | None = None) -> dict:
    p = OneLineParser(prog="python -m bench demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--runs", default="bench_out/demo", help="where the seeds' runs go")
    p.add_argument("--other", default=OTHER, help="a Sudoku CSV whose solutions are blanked")
    p.add_argument("--blanks", type=int, default=30, help="blanks per grid of --other")
    p.add_argument("--out", default="bench/results/demo_seeds.json")
    a = p.parse_args(argv)
    command = "python -m bench demo " + shlex.join(argv or sys.argv[1:])
    from data.sudoku_easy import build_easy_sudoku
    from data.sudoku_sources import read_sudoku_csv
    from train.evaluate import evaluate
    from train.runtime import quiet_tpu_probe

    quiet_tpu_probe()
    header = result_header("demo", command, detect_device())
    count = len(read_sudoku_csv(a.other))
    sets = {}  # where -> the data set directory of --other blanked as OTHER_SETS[where] says
    for where, pattern in OTHER_SETS.items():
        sets[where] = os.path.join(a.runs, f"{where}-{a.blanks}")
        build_easy_sudoku(sets[where], train=0, test=count, blanks=a.blanks, num_aug=0,
                          test_csv=a.other, pattern=pattern)  # fmt: skip
    seeds = []
    for seed in (int(s) for s in a.seeds.split(",")):
        record = {"seed": seed, **_train(seed, a.runs)}
        with open(os.path.join(record["run_dir"], "final.json")) as f:
            final = json.load(f)
        record["step"] = final["step"]
        record["trainer_wall_s"] = final["goodput"]["wall"]  # the trainer's, from final.json
        record["test"] = _figures(evaluate(record["run_dir"]))
        for where, path in sets.items():
            record[where] = _figures(evaluate(record["run_dir"], data=path))
        others = ", ".join(f"{w} {record[w]['exact_accuracy']:.3f}" for w in sets)
        print(f"seed {seed}: test exact {record['test']['exact_accuracy']:.3f}, per ACT step "
              f"{record['test']['per_step_exact_accuracy']}; {others}", flush=True)  # fmt: skip
        seeds.append(record)
    built = {where: {"csv": a.other, "blanks": a.blanks, "count": count, "build": "data.sudoku_easy"
                     f" train=0 test={count} blanks={a.blanks} num_aug=0 test_csv={a.other} "
                     f"pattern={pattern}"} for where, pattern in OTHER_SETS.items()}  # fmt: skip
    result = {
        **header,
        "experiment": EXPERIMENT,
        **built,
        "seeds": seeds,
        "summary": summary(seeds),
    }
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]))
    return result
