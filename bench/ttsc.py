"""Test-time scaling of a trained TRM: exact accuracy vs the number of noisy trajectories K.

    python -m bench ttsc RUN --val VAL_DATA --test TEST_DATA [--name NAME]
                         [--sigmas 0.5,1,2,3] [--trajectories 64] [--select q_halt]
                         [--time-ks 1,4,16,64] [--seed 0] [--batch ROWS] [--out DIR]
                         [--plot docs/ttsc.png]

What it runs, all through `python -m train.evaluate`'s own function (train.evaluate.evaluate):
1. on the VALIDATION split, for each sigma: one evaluation with K = --trajectories; its report
   gives the accuracy for every k = 1, 2, 4, ..., K (the first k trajectories of a K run are a k
   run: models/trm/scaling.py) and the oracle ("any trajectory right");
2. sigma* = the sigma with the best validation exact accuracy at K (ties: the smaller sigma). The
   test split is never used to choose;
3. on the TEST split at sigma*: the same curve, the other selection rule at K beside it, and the
   wall time of an evaluation at each of --time-ks (the whole call: checkpoint open, one
   compile, every batch), plus the plain evaluation (K 1, sigma 0).

Writes OUT/<name>.json and OUT/<name>.md; --plot draws every OUT/*.json into one PNG (one panel
per model: validation curves per sigma, the test curve at sigma*, the oracle).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from bench.machine import detect_device, result_header
from train.errors import user_errors


def _evaluate(run: str, data: str, **options) -> tuple[dict, float]:
    from train.evaluate import evaluate

    t0 = time.perf_counter()
    report = evaluate(run, data=data, **options)
    return report, time.perf_counter() - t0


def _curve(report: dict) -> dict:
    """k -> {exact_accuracy, token_accuracy, oracle_exact_accuracy} of an evaluation's report."""
    return {int(k): v for k, v in report["trajectories"]["by_k"].items()}


def run_model(a) -> dict:
    """The three stages of the module docstring for one model: -> the result record."""
    K, seed = a.trajectories, a.seed
    base = {"batch": a.batch} if a.batch else {}
    val = {}
    for sigma in a.sigmas:
        report, seconds = _evaluate(
            a.run, a.val, trajectories=K, noise=sigma, select=a.select, seed=seed, **base
        )
        val[sigma] = {"curve": _curve(report), "seconds": seconds, "count": report["count"]}
        print(f"val sigma {sigma}: exact {report['exact_accuracy']:.4f} at K={K}", flush=True)
    best = max(a.sigmas, key=lambda s: (val[s]["curve"][K]["exact_accuracy"], -s))
    plain, plain_s = _evaluate(a.run, a.test, **base)
    test, test_s = _evaluate(
        a.run, a.test, trajectories=K, noise=best, select=a.select, seed=seed, **base
    )
    other = "vote" if a.select == "q_halt" else "q_halt"
    other_report, _ = _evaluate(
        a.run, a.test, trajectories=K, noise=best, select=other, seed=seed, **base
    )
    timing = {}
    for k in a.time_ks:
        if k == K:
            timing[k] = test_s
            continue
        _, timing[k] = _evaluate(
            a.run, a.test, trajectories=k, noise=best, select=a.select, seed=seed, **base
        )
    print(
        f"test sigma* {best}: plain {plain['exact_accuracy']:.4f}, K={K} "
        f"{test['exact_accuracy']:.4f} ({a.select}), {other_report['exact_accuracy']:.4f} ({other})",
        flush=True,
    )
    return {
        "name": a.name,
        "run": a.run,
        "val_data": a.val,
        "test_data": a.test,
        "trajectories": K,
        "select": a.select,
        "seed": seed,
        "sigmas": a.sigmas,
        "val": {str(s): v for s, v in val.items()},
        "sigma_star": best,
        "test": {
            "count": test["count"],
            "plain": {"exact_accuracy": plain["exact_accuracy"], "seconds": plain_s},
            "curve": _curve(test),
            other: {"exact_accuracy": other_report["exact_accuracy"]},
            "seconds_by_k": {str(k): s for k, s in timing.items()},
        },
    }


def markdown(r: dict) -> str:
    K, best = r["trajectories"], r["sigma_star"]
    lines = [
        f"**{r['name']}** (`{r['run']}`; validation {r['val'][str(best)]['count']} puzzles, "
        f"test {r['test']['count']}; select {r['select']}, seed {r['seed']})",
        "",
        "validation exact accuracy by k (sigma chosen here, at k = K):",
        "",
        "| sigma | " + " | ".join(f"k={k}" for k in r["val"][str(best)]["curve"]) + " | oracle@K |",
        "|---" * (len(r["val"][str(best)]["curve"]) + 2) + "|",
    ]
    for s, v in r["val"].items():
        row = [f"{c['exact_accuracy']:.4f}" for c in v["curve"].values()]
        mark = " (sigma*)" if float(s) == best else ""
        oracle = v["curve"][K]["oracle_exact_accuracy"]
        lines.append(f"| {s}{mark} | " + " | ".join(row) + f" | {oracle:.4f} |")
    t = r["test"]
    other = "vote" if r["select"] == "q_halt" else "q_halt"
    lines += [
        "",
        f"test at sigma* = {best}: plain {t['plain']['exact_accuracy']:.4f}; "
        f"{other} at K={K}: {t[other]['exact_accuracy']:.4f}",
        "",
        "| k | exact | token | oracle | wall s |",
        "|---|---|---|---|---|",
    ]
    for k, c in t["curve"].items():
        secs = t["seconds_by_k"].get(str(k))
        wall = f"{secs:.1f}" if secs is not None else ""
        lines.append(
            f"| {k} | {c['exact_accuracy']:.4f} | {c['token_accuracy']:.4f} | "
            f"{c['oracle_exact_accuracy']:.4f} | {wall} |"
        )
    return "\n".join(lines) + "\n"


def plot(out: Path, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    results = [r for r in results if r.get("kind") == "ttsc"]
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results):
        for s, v in r["val"].items():
            ks = [int(k) for k in v["curve"]]
            ax.plot(ks, [c["exact_accuracy"] for c in v["curve"].values()], "--", alpha=0.6,
                    label=f"validation, sigma {s}")  # fmt: skip
        t, best = r["test"], r["sigma_star"]
        ks = [int(k) for k in t["curve"]]
        ax.plot(ks, [c["exact_accuracy"] for c in t["curve"].values()], "o-", color="black",
                label=f"test, sigma* {best} ({r['select']})")  # fmt: skip
        ax.plot(ks, [c["oracle_exact_accuracy"] for c in t["curve"].values()], ":",
                color="black", label="test, any trajectory right")  # fmt: skip
        ax.axhline(t["plain"]["exact_accuracy"], color="grey", lw=0.8, label="test, plain")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("trajectories K")
        ax.set_ylabel("exact accuracy")
        ax.set_title(r["name"])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench ttsc", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run directory or checkpoint train.evaluate opens")
    p.add_argument("--val", required=True, help="validation data set (never the test split)")
    p.add_argument("--test", required=True, help="test data set")
    p.add_argument("--name", help="the model's name in the results (default: the run's folder)")
    p.add_argument("--sigmas", default="0.5,1,2,3")
    p.add_argument("--trajectories", type=int, default=64)
    p.add_argument("--select", default="q_halt", choices=("q_halt", "vote"))
    p.add_argument("--time-ks", default="1,4,16,64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=None, help="rows per evaluation batch")
    p.add_argument("--out", default="bench/results/ttsc")
    p.add_argument("--plot", help="PNG of every result in --out")
    a = p.parse_args(argv)
    from train.runtime import quiet_tpu_probe

    quiet_tpu_probe()  # before JAX starts a backend: no libtpu probe lines on a CPU machine
    a.sigmas = [float(s) for s in a.sigmas.split(",")]
    a.time_ks = [int(k) for k in a.time_ks.split(",") if int(k) <= a.trajectories]
    a.name = a.name or os.path.basename(os.path.normpath(a.run))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    header = result_header(
        "ttsc", "python -m bench ttsc " + shlex.join(argv or sys.argv[1:]), detect_device()
    )
    result = {**header, **run_model(a)}
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{a.name}.md").write_text(markdown(result))
    print(markdown(result))
    if a.plot:
        plot(out, a.plot)
    return result


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
