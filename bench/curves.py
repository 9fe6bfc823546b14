"""Whole runs side by side: this trainer and upstream's own code, same data and settings, seeds.

    python -m bench curves [--configs gpt_shakespeare_char_cpu,trm_sudoku_cpu] [--impls jax,upstream]
                           [--seeds 3] --upstream-src DIR [--upstream-src DIR ...]
                           [--input PATH] [--out bench/results/curves] [--plot PATH.png]

Each (config, seed, implementation) is one whole run in its own process, run one after another
and interleaved (seed 0 jax, seed 0 upstream, seed 1 jax, ...), so machine drift hits both sides
alike. The JAX side is `python -m train.main +experiment=<config> run.seed=S` exactly as a user
runs it (persistent compilation cache off: every run compiles); the upstream side is
bench/upstream_runs.py (nanoGPT's train.py as a script; TRM's pretrain.py `launch`). Both train on
the same data set (built once, by our builders, before any clock starts) with the settings of
CURVES below, and report the evaluations they log themselves.

--upstream-src takes the checkouts: a karpathy/nanoGPT one (train.py), a
SamsungSAILMontreal/TinyRecursiveModels one (pretrain.py) and an imoneoi/adam-atan2 one (the TRM
side's optimizer); each is recognised by its files.

Recorded per run: every evaluation (step, metric value, seconds since the process started, so
start-up and the first call are included), the exit status and the wall time. Summarised per
config: per evaluation step each side's mean, min and max over seeds and whether the JAX mean lies
within upstream's [min, max] ("within spread"); per side the time to the target (the first
evaluation at or past it; median over seeds). Output: OUT/curves.json, OUT/curves.md (the tables),
OUT/<run>.log, OUT/runs/<run>/ (the JAX run directories, for `python -m train.evaluate`; upstream's
checkpoints), the figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.machine import detect_device, result_header

JSON_NAME = "curves.json"
REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Curve:
    experiment: str  # configs/experiment/<experiment>.yaml: the JAX side's settings
    family: str  # gpt | trm
    metric: str  # the trainer's metrics.jsonl key
    upstream_metric: str  # the same quantity in upstream's own logs
    mode: str  # "min" | "max": which way is better
    target: float  # for the time to target
    base_seed: int  # seeds are base_seed + 0, 1, ...
    upstream_args: tuple[str, ...] = ()  # nanoGPT: train.py arguments (TRM: derived, below)


CURVES = {
    "gpt_shakespeare_char_cpu": Curve(
        experiment="gpt_shakespeare_char_cpu",
        family="gpt",
        metric="eval/val_loss",
        upstream_metric="val loss",
        mode="min",
        target=2.0,
        base_seed=1337,
        # nanoGPT README's CPU recipe, word for word (configs/experiment/gpt_shakespeare_char_cpu.yaml)
        upstream_args=(
            "--device=cpu",
            "--compile=False",
            "--eval_iters=20",
            "--log_interval=1",
            "--block_size=64",
            "--batch_size=12",
            "--n_layer=4",
            "--n_head=4",
            "--n_embd=128",
            "--max_iters=2000",
            "--lr_decay_iters=2000",
            "--dropout=0.0",
        ),
    ),
    "trm_sudoku_cpu": Curve(
        experiment="trm_sudoku_cpu",
        family="trm",
        metric="eval/all/exact_accuracy",
        upstream_metric="all/exact_accuracy",
        mode="max",
        target=0.3,
        base_seed=0,
    ),
}

# our TRM config -> upstream's Hydra keys (config/cfg_pretrain.yaml, config/arch/trm.yaml)
TRM_ARCH_KEYS = (
    "H_cycles",
    "L_cycles",
    "H_layers",
    "L_layers",
    "hidden_size",
    "expansion",
    "num_heads",
    "pos_encodings",
    "halt_max_steps",
    "halt_exploration_prob",
    "forward_dtype",
    "mlp_t",
    "puzzle_emb_ndim",
    "puzzle_emb_len",
    "no_ACT_continue",
)
TRM_OPTIM_KEYS = (
    "lr",
    "lr_min_ratio",
    "lr_warmup_steps",
    "beta1",
    "beta2",
    "weight_decay",
    "puzzle_emb_lr",
    "puzzle_emb_weight_decay",
    "ema",
    "ema_rate",
)


# ----------------------------------------------------------------------------------------------
# Settings


def upstream_sources(dirs: list[str]) -> dict[str, Path]:
    """{"nanogpt" | "trm" | "adam_atan2": checkout}, each recognised by its files."""
    found: dict[str, Path] = {}
    for d in dirs:
        p = Path(d).expanduser().resolve()
        if (p / "train.py").is_file() and (p / "model.py").is_file():
            kind = "nanogpt"
        elif (p / "pretrain.py").is_file() and (p / "puzzle_dataset.py").is_file():
            kind = "trm"
        elif (p / "adam_atan2" / "adam_atan2.py").is_file():
            kind = "adam_atan2"
        else:
            raise SystemExit(
                f"bench curves: --upstream-src {d}: not a nanoGPT (train.py, model.py), "
                "TinyRecursiveModels (pretrain.py) or adam-atan2 (adam_atan2/) checkout"
            )
        found[kind] = p
    return found


def trainer_config(curve: Curve, overrides: list[str] = ()) -> dict:
    """The experiment composed exactly as `python -m train.main +experiment=...` composes it."""
    from omegaconf import OmegaConf

    from train.compose import load_config

    cfg = load_config([f"+experiment={curve.experiment}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def upstream_trm_overrides(cfg: dict) -> list[str]:
    """Upstream pretrain.py's Hydra overrides for our composed TRM config: the same model, loss,
    optimiser, schedule (epochs, eval_interval) and batch; no evaluators (Sudoku has none)."""
    m, o, t, d = cfg["model"], cfg["optim"], cfg["trainer"], cfg["data"]
    if m.get("arch", "trm") != "trm":
        raise SystemExit(f"bench curves: upstream TRM runs need arch=trm, not {m['arch']}")

    def v(x):
        return str(x).lower() if isinstance(x, bool) else str(x)

    out = [f"arch.{k}={v(m[k])}" for k in TRM_ARCH_KEYS]
    out.append(f"arch.loss.loss_type={m['loss_type']}")
    out += [f"{k}={v(o[k])}" for k in TRM_OPTIM_KEYS]
    out += [
        f"global_batch_size={t['global_batch_size']}",
        f"epochs={d['epochs']}",
        f"eval_interval={d['eval_interval_epochs']}",
        "evaluators=[]",
    ]
    return out


# ----------------------------------------------------------------------------------------------
# Runs


def _timed_lines(cmd: list[str], cwd: Path, env: dict, log: Path, timeout_s: float):
    """Run `cmd`, yield (seconds since start, line) as each stdout/stderr line arrives; the
    log file gets every line. The return code is the generator's return value."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        try:
            for line in proc.stdout:
                t = time.monotonic() - t0
                f.write(line)
                f.flush()  # the log can be followed while the run goes on
                yield t, line.rstrip("\n")
                if t > timeout_s:
                    proc.kill()
                    break
        finally:
            proc.wait()
    return proc.returncode


def _collect(lines, parse) -> tuple[list[dict], int, float]:
    evals, rc, t = [], None, 0.0
    gen = lines
    try:
        while True:
            t, line = next(gen)
            e = parse(line)
            if e is not None:
                evals.append({**e, "t": round(t, 2)})
    except StopIteration as stop:
        rc = stop.value
    return evals, rc, t


_JAX_EVAL = re.compile(r"^step (\d+): (.*)$")
_NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
_TRM_EVAL = re.compile(r"^eval step (\d+): (\{.*\})$")


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_jax(curve: Curve, seed: int, data: str, work: Path, log: Path, timeout_s: float) -> dict:
    name = f"{curve.experiment}-jax-seed{seed}"
    shutil.rmtree(work / name, ignore_errors=True)  # a left-over run would be resumed, not rerun
    cmd = [
        sys.executable,
        "-m",
        "train.main",
        f"+experiment={curve.experiment}",
        f"run.seed={seed}",
        f"run.out_dir={work}",
        f"run.name={name}",
        "run.compilation_cache_dir=null",
        "run.cpu_heap=false",  # glibc's default malloc, as upstream's process has: a fair time
        "logging=off",
        "trainer.progress_bar=false",
        f"data.path={data}",
    ]

    def parse(line):  # the console's eval line: its time; the value comes from metrics.jsonl
        m = _JAX_EVAL.match(line)
        return {"step": int(m.group(1))} if m and curve.metric in m.group(2) else None

    evals, rc, wall = _collect(_timed_lines(cmd, REPO, _env(), log, timeout_s), parse)
    values = {}
    metrics = work / name / "metrics.jsonl"
    if metrics.exists():
        for row in map(json.loads, metrics.read_text().splitlines()):
            if curve.metric in row:
                values[int(row["step"])] = float(row[curve.metric])
    seen, out = set(), []
    for e in evals:
        if e["step"] in values and e["step"] not in seen:
            seen.add(e["step"])
            out.append({"step": e["step"], "value": values[e["step"]], "t": e["t"]})
    return {"evals": out, "returncode": rc, "wall_s": round(wall, 2), "command": shlex.join(cmd)}


def run_upstream(
    curve: Curve, seed: int, data: str, work: Path, log: Path, timeout_s: float, srcs: dict
) -> dict:
    out = work / f"{curve.experiment}-upstream-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    base = [sys.executable, "-m", "bench.upstream_runs"]
    if curve.family == "gpt":
        if "nanogpt" not in srcs:
            raise SystemExit("bench curves: the GPT upstream side needs a nanoGPT --upstream-src")
        args = [*curve.upstream_args, f"--out_dir={out / 'out'}"]
        cmd = base + ["nanogpt", "--src", str(srcs["nanogpt"])]
        cmd += ["--data", data, "--seed", str(seed), "--out", str(out), "--", *args]

        def parse(line):
            m = _NANOGPT_EVAL.match(line)
            return {"step": int(m.group(1)), "value": float(m.group(3))} if m else None

    else:
        missing = [k for k in ("trm", "adam_atan2") if k not in srcs]
        if missing:
            raise SystemExit(
                "bench curves: the TRM upstream side needs --upstream-src checkouts of "
                "TinyRecursiveModels and adam-atan2; missing: " + ", ".join(missing)
            )
        overrides = upstream_trm_overrides(trainer_config(curve))
        cmd = base + ["trm", "--src", str(srcs["trm"]), "--adam-atan2-src", str(srcs["adam_atan2"])]
        cmd += ["--data", data, "--seed", str(seed), "--out", str(out), "--", *overrides]
        key = curve.upstream_metric.split("/")

        def parse(line):
            m = _TRM_EVAL.match(line)
            if not m:
                return None
            value = json.loads(m.group(2))
            for k in key:
                value = value[k]
            return {"step": int(m.group(1)), "value": float(value)}

    evals, rc, wall = _collect(_timed_lines(cmd, REPO, _env(), log, timeout_s), parse)
    return {"evals": evals, "returncode": rc, "wall_s": round(wall, 2), "command": shlex.join(cmd)}


def prepare_data(curve: Curve, input_path: str | None) -> str:
    """The experiment's data set, built by our builders if missing (bench ttq's preparation, which
    builds it as the trainer does); its absolute path."""
    from bench.ttq import prepare_data as build_if_missing

    rc = {"config": curve.experiment, "family": curve.family, "trainer_cfg": trainer_config(curve)}
    return str(Path(build_if_missing(rc, None, input_path)).resolve())


# ----------------------------------------------------------------------------------------------
# Summary


def _better(curve: Curve, value: float) -> bool:
    return value <= curve.target if curve.mode == "min" else value >= curve.target


def summarise(curve: Curve, runs: dict) -> dict:
    """Per evaluation step: each side's mean/min/max over seeds; jax_within_spread; per side the
    time to target (median over the seeds that reached it) and how many reached it."""
    per_step: dict[int, dict] = {}
    for impl, seeds in runs.items():
        for r in seeds.values():
            for e in r["evals"]:
                per_step.setdefault(e["step"], {}).setdefault(impl, []).append(e["value"])
    steps = []
    for step in sorted(per_step):
        row = {"step": step}
        for impl, vals in per_step[step].items():
            row[impl] = {
                "mean": statistics.fmean(vals),
                "min": min(vals),
                "max": max(vals),
                "n": len(vals),
            }
        if "jax" in row and "upstream" in row:
            up, mean = row["upstream"], row["jax"]["mean"]
            row["jax_within_spread"] = up["min"] <= mean <= up["max"]
        steps.append(row)
    ttt = {}
    for impl, seeds in runs.items():
        times = []
        for r in seeds.values():
            hit = next((e for e in r["evals"] if _better(curve, e["value"])), None)
            if hit:
                times.append(hit["t"])
        ttt[impl] = {
            "median_s": statistics.median(times) if times else None,
            "reached": len(times),
            "seeds": len(seeds),
        }
    both = [r for r in steps if "jax_within_spread" in r]
    return {
        "metric": curve.metric,
        "mode": curve.mode,
        "target": curve.target,
        "per_step": steps,
        "within_spread": f"{sum(r['jax_within_spread'] for r in both)}/{len(both)}",
        "time_to_target": ttt,
    }


def write_plot(result: dict, path: Path) -> None:
    """One panel per config: each side's mean over seeds, the min-max band, every seed faint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = result["configs"]
    fig, axes = plt.subplots(1, len(configs), figsize=(5.2 * len(configs), 4), squeeze=False)
    colors = {"jax": "#1f77b4", "upstream": "#d62728"}
    for ax, (name, rec) in zip(axes[0], configs.items()):
        s = rec["summary"]
        for impl in rec["runs"]:
            # step 0 (nanoGPT evaluates before training: ln 65) would squash the scale
            rows = [r for r in s["per_step"] if impl in r and r["step"] > 0]
            x = [r["step"] for r in rows]
            mean = [r[impl]["mean"] for r in rows]
            lo = [r[impl]["min"] for r in rows]
            hi = [r[impl]["max"] for r in rows]
            n = max((r[impl]["n"] for r in rows), default=0)
            c = colors.get(impl, "gray")
            label = {"jax": "this trainer (JAX)", "upstream": "upstream's code"}.get(impl, impl)
            ax.plot(x, mean, color=c, marker="o", ms=3, label=f"{label}, mean of {n} seeds")
            ax.fill_between(x, lo, hi, color=c, alpha=0.2)
            for run in rec["runs"][impl].values():
                ev = [e for e in run["evals"] if e["step"] > 0]
                ax.plot(
                    [e["step"] for e in ev], [e["value"] for e in ev], color=c, lw=0.5, alpha=0.4
                )
        ax.axhline(s["target"], color="gray", lw=0.8, ls=":")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(s["metric"])
        ax.legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(
        f"evaluation curves: mean, seed min-max band, each seed thin ({m['cpu']}, "
        f"{m['cpu_cores']} cores)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict) -> str:
    """Per config: one row per evaluation step (each side's mean and [min, max] over seeds, the
    JAX mean within upstream's spread or not), then the time to target of each side."""
    lines = [
        f"`{result['command']}` at {result['started_utc']}; machine: {result['machine']['cpu']}, "
        f"{result['machine']['cpu_cores']} cores; load average before: {result['loadavg_start']}."
    ]
    for name, rec in result["configs"].items():
        s = rec["summary"]
        impls = list(rec["runs"])
        seeds = {i: len(rec["runs"][i]) for i in impls}
        lines += ["", f"**{name}** ({s['metric']}; seeds: "
                  + ", ".join(f"{i} {n}" for i, n in seeds.items()) + ")", ""]  # fmt: skip
        head = [
            "step",
            *[f"{i} mean [min, max]" for i in impls],
            "jax mean within upstream's spread",
        ]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in s["per_step"]:
            cells = [str(row["step"])]
            for i in impls:
                v = row.get(i)
                cells.append(f"{v['mean']:.4f} [{v['min']:.4f}, {v['max']:.4f}]" if v else "")
            w = row.get("jax_within_spread")
            cells.append("" if w is None else ("yes" if w else "**no**"))
            lines.append("| " + " | ".join(cells) + " |")
        op = "<=" if s["mode"] == "min" else ">="
        lines += ["", f"time to {s['metric']} {op} {s['target']} (first evaluation there, "
                  "seconds since the process started, median over seeds):"]  # fmt: skip
        for i, v in s["time_to_target"].items():
            walls = [r["wall_s"] for r in rec["runs"][i].values()]
            lines.append(f"- {i}: {v['median_s']} s ({v['reached']}/{v['seeds']} seeds reached it); "
                         f"whole run {statistics.median(walls):.0f} s (median)")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench curves", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(CURVES))
    p.add_argument("--impls", default="jax,upstream")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--upstream-src", action="append", default=[], metavar="DIR")
    p.add_argument("--input", help="tiny-shakespeare input.txt (else downloaded when missing)")
    p.add_argument("--out", default="bench/results/curves")
    p.add_argument("--plot", help="PNG path (default OUT/curves.png)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs OUT/curves.json already holds (same config, side and seed, exit 0) "
        "and run only the missing ones: add seeds, or finish an interrupted comparison",
    )
    a = p.parse_args(argv)
    names, impls = a.configs.split(","), a.impls.split(",")
    for n in names:
        if n not in CURVES:
            raise SystemExit(f"bench curves: unknown config {n!r}; known: {', '.join(CURVES)}")
    for i in impls:
        if i not in ("jax", "upstream"):
            raise SystemExit(f"bench curves: unknown impl {i!r}; known: jax, upstream")
    srcs = upstream_sources(a.upstream_src) if "upstream" in impls else {}
    if importlib.util.find_spec("matplotlib") is None:  # before any run, not after an hour of them
        raise SystemExit("bench curves: the figure needs matplotlib: pip install -e '.[plot]'")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = result_header("curves", "python -m bench curves " + shlex.join(argv or sys.argv[1:]),
                           detect_device())  # fmt: skip
    result["upstream_commits"] = {k: _commit(v) for k, v in srcs.items()}
    result["configs"] = {}
    earlier = {}
    if a.resume and (out / JSON_NAME).exists():
        earlier = json.loads((out / JSON_NAME).read_text()).get("configs", {})
        # configs not asked for this time stay in the result (and the figure) as they were
        result["configs"] = {k: v for k, v in earlier.items() if k not in names}
    runs_dir = out / "runs"  # every run's own folder (run directories, upstream checkpoints)
    for name in names:
        curve = CURVES[name]
        data = prepare_data(curve, a.input)
        runs: dict[str, dict] = {i: {} for i in impls}
        for k in range(a.seeds):
            seed = curve.base_seed + k
            for impl in impls:
                log = out / f"{name}-{impl}-seed{seed}.log"
                kept = earlier.get(name, {}).get("runs", {}).get(impl, {}).get(str(seed))
                if kept and kept["returncode"] == 0:
                    print(f"[curves] {name} {impl} seed {seed}: kept from {out / JSON_NAME}")
                    runs[impl][str(seed)] = kept
                    continue
                print(f"[curves] {name} {impl} seed {seed} ...", flush=True)
                if impl == "jax":
                    r = run_jax(curve, seed, data, runs_dir, log, a.timeout_s)
                else:
                    r = run_upstream(curve, seed, data, runs_dir, log, a.timeout_s, srcs)
                last = r["evals"][-1] if r["evals"] else {}
                print(f"[curves]   exit {r['returncode']}, {r['wall_s']:.0f} s, last eval "
                      f"{last.get('step')}: {last.get('value')}  (log: {log})", flush=True)  # fmt: skip
                if r["returncode"] != 0:
                    raise SystemExit(f"bench curves: {name} {impl} seed {seed} failed: {log}")
                runs[impl][str(seed)] = r
                _save(out, result, name, curve, data, runs)
        _save(out, result, name, curve, data, runs)
    plot = Path(a.plot) if a.plot else out / "curves.png"
    write_plot(result, plot)
    (out / "curves.md").write_text(markdown(result))
    for name, rec in result["configs"].items():
        s = rec["summary"]
        print(f"[curves] {name}: jax mean within upstream's seed spread at {s['within_spread']} "
              f"evaluations; time to {s['metric']} {'<=' if s['mode'] == 'min' else '>='} "
              f"{s['target']}: " + ", ".join(f"{i} {v['median_s']} s ({v['reached']}/{v['seeds']})"
                                              for i, v in s["time_to_target"].items()))  # fmt: skip
    print(f"[curves] wrote {out / JSON_NAME}, {out / 'curves.md'} and {plot}")
    return result


def _save(out: Path, result: dict, name: str, curve: Curve, data: str, runs: dict) -> None:
    """Write OUT/curves.json after every run, so an interrupted comparison loses one run at most."""
    result["configs"][name] = {
        "curve": dataclasses.asdict(curve),
        "data": data,
        "runs": runs,
        "summary": summarise(curve, runs),
    }
    (out / JSON_NAME).write_text(json.dumps(result, indent=1) + "\n")


def _commit(src: Path) -> str:
    from parity.goldens.common import git_commit

    return git_commit(src)
