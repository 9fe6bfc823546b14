"""Test-time scaling of a trained TRM: exact accuracy vs the number of noisy trajectories K.

    python -m bench ttsc RUN --val VAL_DATA --test TEST_DATA [--name NAME] [--sigmas 0.5,1,2,3]
                         [--trajectories 64] [--select q_halt] [--time-ks 1,4,16,64] [--seed 0]
                         [--batch ROWS] [--out DIR] [--plot docs/ttsc.png]

Through train.evaluate's own function: on the VALIDATION split one evaluation per sigma with K =
--trajectories (its report gives every k = 1, 2, 4, ..., K and the oracle, "any trajectory
right"); sigma* = the best at K there (the test split never chooses); on the TEST split at sigma*
the same curve, the other selection rule at K, the plain evaluation, and each of --time-ks timed
as a whole call. Writes OUT/<name>.json and .md; --plot draws every OUT/*.json into one PNG.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from bench.machine import detect_device, result_header
from train.errors import OneLineParser


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
    K, base = a.trajectories, {"seed": a.seed, **({"batch": a.batch} if a.batch else {})}

    def noisy(data, k=K, sigma=None, select=a.select):
        return _evaluate(a.run, data, trajectories=k, noise=sigma, select=select, **base)

    val = {}
    for sigma in a.sigmas:
        report, seconds = noisy(a.val, sigma=sigma)
        val[sigma] = {"curve": _curve(report), "seconds": seconds, "count": report["count"]}
        print(f"val sigma {sigma}: exact {report['exact_accuracy']:.4f} at K={K}", flush=True)
    best = max(a.sigmas, key=lambda s: (val[s]["curve"][K]["exact_accuracy"], -s))
    plain, plain_s = _evaluate(a.run, a.test, **({"batch": a.batch} if a.batch else {}))
    test, test_s = noisy(a.test, sigma=best)
    other = "vote" if a.select == "q_halt" else "q_halt"
    other_report, _ = noisy(a.test, sigma=best, select=other)
    timing = {k: test_s if k == K else noisy(a.test, k, best)[1] for k in a.time_ks}
    print(f"test sigma* {best}: plain {plain['exact_accuracy']:.4f}, K={K} "
          f"{test['exact_accuracy']:.4f} ({a.select}), {other_report['exact_accuracy']:.4f} "
          f"({other})", flush=True)  # fmt: skip
    return {"name": a.name, "run": a.run, "val_data": a.val, "test_data": a.test,
            "trajectories": K, "select": a.select, "seed": a.seed, "sigmas": a.sigmas,
            "val": {str(s): v for s, v in val.items()}, "sigma_star": best,
            "test": {"count": test["count"], "curve": _curve(test),
                     "plain": {"exact_accuracy": plain["exact_accuracy"], "seconds": plain_s},
                     other: {"exact_accuracy": other_report["exact_accuracy"]},
                     "seconds_by_k": {str(k): s for k, s in timing.items()}}}  # fmt: skip


def markdown(r: dict) -> str:
    K, best = r["trajectories"], r["sigma_star"]
    ks = r["val"][str(best)]["curve"]
    lines = [f"**{r['name']}** (`{r['run']}`; validation {r['val'][str(best)]['count']} puzzles, "
             f"test {r['test']['count']}; select {r['select']}, seed {r['seed']})", "",
             "validation exact accuracy by k (sigma chosen here, at k = K):", "",
             "| sigma | " + " | ".join(f"k={k}" for k in ks) + " | oracle@K |",
             "|---" * (len(ks) + 2) + "|"]  # fmt: skip
    for s, v in r["val"].items():
        row = [f"{c['exact_accuracy']:.4f}" for c in v["curve"].values()]
        mark = " (sigma*)" if float(s) == best else ""
        oracle = v["curve"][K]["oracle_exact_accuracy"]
        lines.append(f"| {s}{mark} | " + " | ".join(row) + f" | {oracle:.4f} |")
    t = r["test"]
    other = "vote" if r["select"] == "q_halt" else "q_halt"
    lines += ["", f"test at sigma* = {best}: plain {t['plain']['exact_accuracy']:.4f}; {other} "
              f"at K={K}: {t[other]['exact_accuracy']:.4f}", "", "| k | exact | token | oracle | "
              "wall s |", "|---|---|---|---|---|"]  # fmt: skip
    for k, c in t["curve"].items():
        secs = t["seconds_by_k"].get(str(k))
        lines.append(f"| {k} | {c['exact_accuracy']:.4f} | {c['token_accuracy']:.4f} | "
                     f"{c['oracle_exact_accuracy']:.4f} | {'' if secs is None else f'{secs:.1f}'} |")  # fmt: skip
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
        ax.set(xlabel="trajectories K", ylabel="exact accuracy", title=r["name"])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict:
    p = OneLineParser(prog="python -m bench ttsc", description=__doc__.split("\n\n")[0])
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
    command = "python -m bench ttsc " + shlex.join(argv or sys.argv[1:])
    result = {**result_header("ttsc", command, detect_device()), **run_model(a)}
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{a.name}.md").write_text(markdown(result))
    print(markdown(result))
    if a.plot:
        plot(out, a.plot)
    return result
