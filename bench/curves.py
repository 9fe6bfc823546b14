"""Whole runs side by side: this trainer and upstream's own code, same data and settings, seeds.

    python -m bench curves [--configs gpt_shakespeare_char_cpu,trm_sudoku_cpu] [--impls jax,upstream]
                           [--seeds 3] --upstream-src DIR [--upstream-src DIR ...]
                           [--input PATH] [--out bench/results/curves] [--plot PATH.png] [--resume]

Each (config, seed, implementation) is one whole run in its own process, run one after another
and interleaved (seed 0 jax, seed 0 upstream, seed 1 jax, ...), so machine drift hits both sides
alike. The JAX side is `python -m train.main +experiment=<config> run.seed=S` exactly as a user
runs it (persistent compilation cache off: every run compiles); the upstream side is
bench/upstream_runs.py (nanoGPT's train.py as a script; TRM's pretrain.py `launch`). Both train on
the same data set (built once, by our builders, before any clock starts) with the settings of
CURVES below, and report the evaluations they log themselves. --upstream-src takes the checkouts
(karpathy/nanoGPT, SamsungSAILMontreal/TinyRecursiveModels, imoneoi/adam-atan2), each recognised
by its files.

Recorded per run: every evaluation (step, value, seconds since the process started, so start-up
and the first call count), the exit status and the wall time. Summarised per config: per
evaluation step each side's mean, min and max over seeds and whether the JAX mean lies within
upstream's [min, max]; per side the time to the target (the first evaluation at or past it;
median over seeds). Output: OUT/curves.json, OUT/curves.md (the tables), OUT/<run>.log,
OUT/runs/<run>/ (the run directories, for `python -m train.evaluate`), the figure. --resume keeps
the runs OUT/curves.json holds and runs only the missing ones.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import shutil
import statistics
import sys
from pathlib import Path

from bench.machine import detect_device, result_header, run_streamed
from train.errors import ConfigError, OneLineParser

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
    # nanoGPT README's CPU recipe, word for word (configs/experiment/gpt_shakespeare_char_cpu.yaml)
    "gpt_shakespeare_char_cpu": Curve(
        "gpt_shakespeare_char_cpu", "gpt", "eval/val_loss", "val loss", "min", 2.0, 1337,
        tuple("--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 "
              "--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 "
              "--lr_decay_iters=2000 --dropout=0.0".split())),
    "trm_sudoku_cpu": Curve("trm_sudoku_cpu", "trm", "eval/all/exact_accuracy",
                            "all/exact_accuracy", "max", 0.3, 0),
}  # fmt: skip

# our TRM config -> upstream's Hydra keys (config/cfg_pretrain.yaml, config/arch/trm.yaml)
TRM_ARCH_KEYS = ("H_cycles L_cycles H_layers L_layers hidden_size expansion num_heads "
                 "pos_encodings halt_max_steps halt_exploration_prob forward_dtype mlp_t "
                 "puzzle_emb_ndim puzzle_emb_len no_ACT_continue").split()  # fmt: skip
TRM_OPTIM_KEYS = ("lr lr_min_ratio lr_warmup_steps beta1 beta2 weight_decay puzzle_emb_lr "
                  "puzzle_emb_weight_decay ema ema_rate").split()  # fmt: skip


def upstream_sources(dirs: list[str]) -> dict[str, Path]:
    """{"nanogpt" | "trm" | "adam_atan2": checkout}, each recognised by its files."""
    kinds = {"nanogpt": ("train.py", "model.py"), "trm": ("pretrain.py", "puzzle_dataset.py"),
             "adam_atan2": ("adam_atan2/adam_atan2.py",)}  # fmt: skip
    found: dict[str, Path] = {}
    for d in dirs:
        p = Path(d).expanduser().resolve()
        kind = next(
            (k for k, files in kinds.items() if all((p / f).is_file() for f in files)), None
        )
        if kind is None:
            raise ConfigError(f"bench curves: --upstream-src {d}: not a nanoGPT (train.py, model.py), "
                             "TinyRecursiveModels (pretrain.py) or adam-atan2 (adam_atan2/) checkout")  # fmt: skip
        found[kind] = p
    return found


def trainer_config(experiment: str) -> dict:
    """The experiment composed exactly as `python -m train.main +experiment=...` composes it."""
    from omegaconf import OmegaConf

    from train.compose import load_config

    return OmegaConf.to_container(load_config([f"+experiment={experiment}"]), resolve=True)


def upstream_trm_overrides(cfg: dict) -> list[str]:
    """Upstream pretrain.py's Hydra overrides for our composed TRM config: the same model, loss,
    optimiser, schedule (epochs, eval_interval) and batch; no evaluators (Sudoku has none)."""
    m, o, t, d = cfg["model"], cfg["optim"], cfg["trainer"], cfg["data"]
    if m.get("arch", "trm") != "trm":
        raise ConfigError(f"bench curves: upstream TRM runs need arch=trm, not {m['arch']}")

    def v(x):
        return str(x).lower() if isinstance(x, bool) else str(x)

    return [*(f"arch.{k}={v(m[k])}" for k in TRM_ARCH_KEYS), f"arch.loss.loss_type={m['loss_type']}",
            *(f"{k}={v(o[k])}" for k in TRM_OPTIM_KEYS), f"global_batch_size={t['global_batch_size']}",
            f"epochs={d['epochs']}", f"eval_interval={d['eval_interval_epochs']}", "evaluators=[]"]  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Runs


_JAX_EVAL = re.compile(r"^step (\d+): (.*)$")
_NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
_TRM_EVAL = re.compile(r"^eval step (\d+): (\{.*\})$")


def _run(cmd: list[str], log: Path, timeout_s: float, parse) -> dict:
    """Run `cmd`; every line `parse` turns into an evaluation is kept with its time."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    evals = []

    def on_line(t, line):
        if (e := parse(line)) is not None:
            evals.append({**e, "t": round(t, 2)})

    with open(log, "w") as f:
        rc, wall, _ = run_streamed(cmd, box_s=timeout_s, log=f, env=env, on_line=on_line)
    return {"evals": evals, "returncode": rc, "wall_s": round(wall, 2), "command": shlex.join(cmd)}


def run_jax(curve: Curve, seed: int, data: str, work: Path, log: Path, timeout_s: float) -> dict:
    name = f"{curve.experiment}-jax-seed{seed}"
    shutil.rmtree(work / name, ignore_errors=True)  # a left-over run would be resumed, not rerun
    cmd = [sys.executable, "-m", "train.main", f"+experiment={curve.experiment}", f"run.seed={seed}",
           f"run.out_dir={work}", f"run.name={name}", "run.compilation_cache_dir=null",
           "run.cpu_heap=false",  # glibc's default malloc, as upstream's process has: a fair time
           "logging=off", "trainer.progress_bar=false", f"data.path={data}"]  # fmt: skip

    def parse(line):  # the console's eval line: its time; the value comes from metrics.jsonl
        m = _JAX_EVAL.match(line)
        return {"step": int(m.group(1))} if m and curve.metric in m.group(2) else None

    r = _run(cmd, log, timeout_s, parse)
    metrics, values = work / name / "metrics.jsonl", {}
    for row in map(json.loads, metrics.read_text().splitlines() if metrics.exists() else []):
        if curve.metric in row:
            values[int(row["step"])] = float(row[curve.metric])
    firsts = {e["step"]: e for e in reversed(r["evals"]) if e["step"] in values}
    r["evals"] = [{**e, "value": values[s]} for s, e in sorted(firsts.items())]
    return r


def run_upstream(curve, seed, data, work: Path, log: Path, timeout_s: float, srcs: dict) -> dict:
    out = work / f"{curve.experiment}-upstream-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "bench.upstream_runs"]
    if curve.family == "gpt":
        if "nanogpt" not in srcs:
            raise ConfigError("bench curves: the GPT upstream side needs a nanoGPT --upstream-src")
        cmd += ["nanogpt", "--src", str(srcs["nanogpt"]), "--data", data, "--seed", str(seed),
                "--out", str(out), "--", *curve.upstream_args, f"--out_dir={out / 'out'}"]  # fmt: skip

        def parse(line):
            m = _NANOGPT_EVAL.match(line)
            return {"step": int(m.group(1)), "value": float(m.group(3))} if m else None

        return _run(cmd, log, timeout_s, parse)
    if missing := [k for k in ("trm", "adam_atan2") if k not in srcs]:
        raise ConfigError("bench curves: the TRM upstream side needs --upstream-src checkouts of "
                         f"TinyRecursiveModels and adam-atan2; missing: {', '.join(missing)}")  # fmt: skip
    cmd += ["trm", "--src", str(srcs["trm"]), "--adam-atan2-src", str(srcs["adam_atan2"]),
            "--experiment", curve.experiment, "--data", data, "--seed", str(seed), "--out",
            str(out)]  # fmt: skip

    def parse(line):
        m = _TRM_EVAL.match(line)
        if not m:
            return None
        value = json.loads(m.group(2))
        for k in curve.upstream_metric.split("/"):
            value = value[k]
        return {"step": int(m.group(1)), "value": float(value)}

    return _run(cmd, log, timeout_s, parse)


def prepare_data(curve: Curve, input_path: str | None) -> str:
    """The experiment's data set, built by our builders if missing (as the trainer builds it)."""
    from bench.ttq import prepare_data as build_if_missing

    cfg = trainer_config(curve.experiment)
    rc = {"config": curve.experiment, "family": curve.family, "trainer_cfg": cfg}
    return str(Path(build_if_missing(rc, None, input_path)).resolve())


# ----------------------------------------------------------------------------------------------
# Summary


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
            row[impl] = {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals),
                         "n": len(vals)}  # fmt: skip
        if "jax" in row and "upstream" in row:
            up = row["upstream"]
            row["jax_within_spread"] = up["min"] <= row["jax"]["mean"] <= up["max"]
        steps.append(row)
    better = (lambda v: v <= curve.target) if curve.mode == "min" else lambda v: v >= curve.target
    ttt = {}
    for impl, seeds in runs.items():
        hits = [
            next((e["t"] for e in r["evals"] if better(e["value"])), None) for r in seeds.values()
        ]
        times = [t for t in hits if t is not None]
        ttt[impl] = {"median_s": statistics.median(times) if times else None,
                     "reached": len(times), "seeds": len(seeds)}  # fmt: skip
    both = [r for r in steps if "jax_within_spread" in r]
    return {"metric": curve.metric, "mode": curve.mode, "target": curve.target, "per_step": steps,
            "within_spread": f"{sum(r['jax_within_spread'] for r in both)}/{len(both)}",
            "time_to_target": ttt}  # fmt: skip


def write_plot(result: dict, path: Path) -> None:
    """One panel per config: each side's mean over seeds, the min-max band, every seed faint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = result["configs"]
    fig, axes = plt.subplots(1, len(configs), figsize=(5.2 * len(configs), 4), squeeze=False)
    colors = {"jax": "#1f77b4", "upstream": "#d62728"}
    labels = {"jax": "this trainer (JAX)", "upstream": "upstream's code"}
    for ax, (name, rec) in zip(axes[0], configs.items()):
        s = rec["summary"]
        for impl in rec["runs"]:
            # step 0 (nanoGPT evaluates before training: ln 65) would squash the scale
            rows = [r for r in s["per_step"] if impl in r and r["step"] > 0]
            x, c = [r["step"] for r in rows], colors.get(impl, "gray")
            n = max((r[impl]["n"] for r in rows), default=0)
            ax.plot(x, [r[impl]["mean"] for r in rows], color=c, marker="o", ms=3,
                    label=f"{labels.get(impl, impl)}, mean of {n} seeds")  # fmt: skip
            ax.fill_between(x, [r[impl]["min"] for r in rows], [r[impl]["max"] for r in rows],
                            color=c, alpha=0.2)  # fmt: skip
            for run in rec["runs"][impl].values():
                ev = [e for e in run["evals"] if e["step"] > 0]
                ax.plot(
                    [e["step"] for e in ev], [e["value"] for e in ev], color=c, lw=0.5, alpha=0.4
                )
        ax.axhline(s["target"], color="gray", lw=0.8, ls=":")
        ax.set(title=name, xlabel="optimizer step", ylabel=s["metric"])
        ax.legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(f"evaluation curves: mean, seed min-max band, each seed thin ({m['cpu']}, "
                 f"{m['cpu_cores']} cores)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def step_table(rec: dict) -> list[str]:
    """One config's per-evaluation table: each side's mean [min, max] over seeds, and whether the
    JAX mean lies within upstream's spread."""
    impls = list(rec["runs"])
    head = ["step", *[f"{i} mean [min, max]" for i in impls], "jax mean within upstream's spread"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rec["summary"]["per_step"]:
        cells = [str(row["step"])]
        for i in impls:
            v = row.get(i)
            cells.append(f"{v['mean']:.4f} [{v['min']:.4f}, {v['max']:.4f}]" if v else "")
        w = row.get("jax_within_spread")
        cells.append("" if w is None else ("yes" if w else "**no**"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(result: dict) -> str:
    lines = [f"`{result['command']}` at {result['started_utc']}; machine: "
             f"{result['machine']['cpu']}, {result['machine']['cpu_cores']} cores; load average "
             f"before: {result['loadavg_start']}."]  # fmt: skip
    for name, rec in result["configs"].items():
        s = rec["summary"]
        seeds = ", ".join(f"{i} {len(r)}" for i, r in rec["runs"].items())
        lines += ["", f"**{name}** ({s['metric']}; seeds: {seeds})", "", *step_table(rec), "",
                  f"time to {s['metric']} {'<=' if s['mode'] == 'min' else '>='} {s['target']} "
                  "(first evaluation there, seconds since the process started, median over seeds):"]  # fmt: skip
        for i, v in s["time_to_target"].items():
            walls = [r["wall_s"] for r in rec["runs"][i].values()]
            lines.append(f"- {i}: {v['median_s']} s ({v['reached']}/{v['seeds']} seeds reached it); "
                         f"whole run {statistics.median(walls):.0f} s (median)")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = OneLineParser(prog="python -m bench curves", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(CURVES))
    p.add_argument("--impls", default="jax,upstream")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--upstream-src", action="append", default=[], metavar="DIR")
    p.add_argument("--input", help="tiny-shakespeare input.txt (else downloaded when missing)")
    p.add_argument("--out", default="bench/results/curves")
    p.add_argument("--plot", help="PNG path (default OUT/curves.png)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument("--resume", action="store_true", help="keep the runs OUT/curves.json holds "
                   "(same config, side and seed, exit 0) and run only the missing ones")  # fmt: skip
    a = p.parse_args(argv)
    names, impls = a.configs.split(","), a.impls.split(",")
    for n in names:
        if n not in CURVES:
            raise ConfigError(f"bench curves: unknown config {n!r}; known: {', '.join(CURVES)}")
    for i in impls:
        if i not in ("jax", "upstream"):
            raise ConfigError(f"bench curves: unknown impl {i!r}; known: jax, upstream")
    srcs = upstream_sources(a.upstream_src) if "upstream" in impls else {}
    if importlib.util.find_spec("matplotlib") is None:  # before any run, not after an hour of them
        raise ConfigError("bench curves: the figure needs matplotlib: pip install -e '.[plot]'")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = result_header("curves", "python -m bench curves " + shlex.join(argv or sys.argv[1:]),
                           detect_device())  # fmt: skip
    from parity.goldens.common import git_commit

    result["upstream_commits"] = {k: git_commit(v) for k, v in srcs.items()}
    earlier = json.loads((out / JSON_NAME).read_text())["configs"] if a.resume and (
        out / JSON_NAME).exists() else {}  # fmt: skip
    # configs not asked for this time stay in the result (and the figure) as they were
    result["configs"] = {k: v for k, v in earlier.items() if k not in names}
    for name in names:
        curve, runs = CURVES[name], {i: {} for i in impls}
        data = prepare_data(curve, a.input)
        for seed in range(curve.base_seed, curve.base_seed + a.seeds):
            for impl in impls:
                log = out / f"{name}-{impl}-seed{seed}.log"
                kept = earlier.get(name, {}).get("runs", {}).get(impl, {}).get(str(seed))
                if kept and kept["returncode"] == 0:
                    print(f"[curves] {name} {impl} seed {seed}: kept from {out / JSON_NAME}")
                    runs[impl][str(seed)] = kept
                    continue
                print(f"[curves] {name} {impl} seed {seed} ...", flush=True)
                args = (curve, seed, data, out / "runs", log, a.timeout_s)
                r = run_jax(*args) if impl == "jax" else run_upstream(*args, srcs)
                last = r["evals"][-1] if r["evals"] else {}
                print(f"[curves]   exit {r['returncode']}, {r['wall_s']:.0f} s, last eval "
                      f"{last.get('step')}: {last.get('value')}  (log: {log})", flush=True)  # fmt: skip
                if r["returncode"] != 0:
                    raise ConfigError(f"bench curves: {name} {impl} seed {seed} failed: {log}")
                runs[impl][str(seed)] = r
                _save(out, result, name, curve, data, runs)
        _save(out, result, name, curve, data, runs)
    plot = Path(a.plot) if a.plot else out / "curves.png"
    write_plot(result, plot)
    (out / "curves.md").write_text(markdown(result))
    print(f"[curves] wrote {out / JSON_NAME}, {out / 'curves.md'} and {plot}")
    return result


def _save(out: Path, result: dict, name: str, curve: Curve, data: str, runs: dict) -> None:
    """Write OUT/curves.json after every run, so an interrupted comparison loses one run at most."""
    result["configs"][name] = {"curve": dataclasses.asdict(curve), "data": data, "runs": runs,
                               "summary": summarise(curve, runs)}  # fmt: skip
    (out / JSON_NAME).write_text(json.dumps(result, indent=1) + "\n")
