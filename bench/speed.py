"""Side-by-side step-time benchmark: the JAX train step vs the PyTorch reference, eager and compiled.

    python -m bench [--configs a,b] [--impls jax,torch_eager,torch_compile] [--steps N]
                    [--warmup N] [--inner K] [--out DIR] [--device auto|cpu|gpu] [--peak-flops F]
                    [--jax-model KEY=VALUE ...] [--threads N] [--data DIR] [--tokens data|uniform]

Each implementation is a worker process (bench/worker.py) holding its model, optimiser state and
ONE fixed batch; the parent drives them in interleaved rounds (A B C A B C ...), each round K
steps and one device sync, and takes ratios round by round before the median. What is compared
and how it is measured: docs/benchmarks.md, "How it measures". Writes <out>/bench.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from bench import configs as bench_configs
from bench.machine import detect_device, gpu_names, loadavg, result_header
from bench.worker import Worker, WorkerError, record_error
from train.errors import ConfigError, OneLineParser

IMPLS = ("jax", "torch_eager", "torch_compile")
JSON_NAME = "bench.json"


def summarize(values: list[float]) -> dict:
    """Median, quartiles and range of a list of per-step times (seconds)."""
    if not values:
        return {}
    v = sorted(values)
    q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive") if len(v) >= 2 else (v[0],) * 3
    return {"median": statistics.median(v), "q1": q1, "q3": q3, "min": v[0], "max": v[-1],
            "n": len(v)}  # fmt: skip


def paired_ratios(a: list[float], b: list[float]) -> dict:
    """summarize() of a[r] / b[r] round by round: drift of the machine between rounds cancels."""
    return summarize([x / y for x, y in zip(a, b) if y > 0])


# ----------------------------------------------------------------------------------------------
# One config: its implementations interleaved round by round


def flops_per_step(rc: dict) -> int:
    """Analytic FLOPs of one train step of a resolved config (models/<family>/flops.py)."""
    if rc["family"] == "gpt":
        from models.gpt import GPTConfig
        from models.gpt.flops import gpt_flops_per_step

        return gpt_flops_per_step(GPTConfig(**rc["model"]), rc["batch_size"])
    from models.trm import TRMConfig
    from models.trm.flops import trm_flops_per_step

    b = rc["batch_size"]
    return trm_flops_per_step(TRMConfig(**{**rc["model"], "batch_size": b}), b)


def bench_config(cfg, impls, *, device, steps, warmup, inner, seed, peak_flops, timeout_s,
                 jax_overrides=(), threads=None, tokens="data", data_path=None, log=print) -> dict:  # fmt: skip
    """Run one config's implementations interleaved; return its JSON record. Every
    implementation steps on the same batch (bench.runners.make_batch: `tokens`, `data_path`)."""
    rc = bench_configs.resolve(cfg, seed=seed, jax_overrides=jax_overrides, data_path=data_path)
    try:
        flops = flops_per_step(rc)
    except ValueError:  # a model config its own class refuses: each side reports the error
        flops = None
    record = {"config": cfg.name, "family": rc["family"], "config_source": rc["source"],
              "batch_size": rc["batch_size"], "dtype": rc["dtype"], "model": rc["model"],
              "optim": rc["optim"], "unit": rc["unit"], "items_per_step": rc["items_per_step"],
              "flops_per_step": flops, "jax_overrides": list(jax_overrides), "tokens": tokens,
              "data_path": data_path, "threads": threads, "schedule": [], "impls": {},
              "ratios": {}, "peak_flops_source": "given by --peak-flops" if peak_flops else None}  # fmt: skip
    workers: dict[str, Worker] = {}
    for impl in impls:
        spec = {"impl": impl, "device": device, "resolved": rc, "seed": seed, "threads": threads,
                "tokens": tokens, "peak_flops": not peak_flops}  # fmt: skip
        res = record["impls"][impl] = {"status": "ok"}
        log(f"[{cfg.name}] starting {impl} ...")
        try:
            workers[impl] = Worker(spec, timeout_s)
            res["info"] = workers[impl].info
            log(f"[{cfg.name}] {impl}: batch from {res['info'].get('batch_source')}")
            if res["info"].get("peak_flops"):  # the JAX worker's, when not given
                peak_flops, record["peak_flops_source"] = res["info"]["peak_flops"]
        except WorkerError as e:
            log(f"[{cfg.name}] {impl} failed at setup: {record_error(res, e)}")

    times: dict[str, list[float]] = {name: [] for name in workers}
    losses: dict[str, list[float]] = {name: [] for name in workers}

    def one_round(n: int, timed: bool) -> None:
        for name in list(workers):
            record["schedule"].append(name)
            try:
                out = workers[name].call("run", n)
            except WorkerError as e:
                log(f"[{cfg.name}] {name} failed: {record_error(record['impls'][name], e)}")
                workers.pop(name).close()
                continue
            losses[name].append(out["loss"])
            if timed:
                times[name].append(out["seconds"] / n)
            else:
                record["impls"][name].setdefault("first_step_s", out["seconds"])

    one_round(1, timed=False)  # trace + compile + one step
    for _ in range(warmup):
        one_round(inner, timed=False)
    compiles_before = {name: w.call("stats").get("compiles") for name, w in workers.items()}
    for r in range(steps):
        one_round(inner, timed=True)
        if (r + 1) % max(1, steps // 4) == 0:
            log(f"[{cfg.name}] round {r + 1}/{steps}")

    for name, w in workers.items():
        res = record["impls"][name]
        stats = w.call("stats")
        w.close()
        t = res["step_time_s"] = summarize(times[name])
        res.update(losses=losses[name], memory=stats)
        if t:
            res["items_per_s"] = rc["items_per_step"] / t["median"]
            res["flops_per_s"] = flops / t["median"] if flops else None
            res["mfu"] = flops / t["median"] / peak_flops if flops and peak_flops else None
            res["compile_s"] = max(0.0, res["first_step_s"] - t["median"])
        before, after = compiles_before.get(name), stats.get("compiles")
        res["recompiles_during_timing"] = None if None in (before, after) else after - before
    record["peak_flops"] = peak_flops
    pairs = [("jax", "torch_eager"), ("jax", "torch_compile"), ("torch_compile", "torch_eager")]
    for a, b in pairs:
        if times.get(a) and times.get(b):
            record["ratios"][f"{a}/{b}"] = paired_ratios(times[a], times[b])
    return record


# ----------------------------------------------------------------------------------------------
# The command


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--configs", default=None, help="comma list; default: tiny on CPU, real on GPU")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma list from {IMPLS}")
    p.add_argument("--steps", type=int, default=10, help="timed rounds")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds after the first call")
    p.add_argument("--inner", type=int, default=5, help="steps per round (one sync per round)")
    p.add_argument("--out", default="bench_out", help="directory for bench.json")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    p.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s for MFU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker answer")
    p.add_argument("--jax-model", action="append", default=[], metavar="KEY=VALUE",
                   help="change the JAX side only: a model field (scan=true) or optim.NAME")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="CPU only: pin every worker to this many cores (default: all)")  # fmt: skip
    p.add_argument("--data", default=None, metavar="DIR",
                   help="the data set the batch comes from (default: the experiment's data.path; "
                   "without one on disk, a generator with its token statistics)")  # fmt: skip
    p.add_argument("--tokens", default="data", choices=("data", "uniform"),
                   help="data: the data set's own batches (or its statistics); uniform: every "
                   "token id equally likely (hides a contended embedding gradient)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    device = detect_device() if a.device == "auto" else a.device
    if device == "gpu" and not gpu_names():
        raise ConfigError("bench: --device gpu, but nvidia-smi lists no NVIDIA GPU on this machine "
                         "(use --device cpu, or auto to pick what is there)")  # fmt: skip
    default = bench_configs.GPU_DEFAULT if device == "gpu" else bench_configs.CPU_DEFAULT
    names = [n.strip() for n in a.configs.split(",")] if a.configs else list(default)
    cfgs = [bench_configs.get(n) for n in names if n]
    impls = [i.strip() for i in a.impls.split(",") if i.strip()]
    for i in impls:
        if i not in IMPLS:
            raise ConfigError(f"bench: unknown impl {i!r}; expected some of {IMPLS}")
    jax_overrides = [bench_configs.jax_override(o) for o in a.jax_model]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = result_header("speed", "python -m bench " + shlex.join(argv), device)
    result["settings"] = {"steps": a.steps, "warmup": a.warmup, "inner": a.inner, "seed": a.seed,
                          "impls": impls, "threads": a.threads}  # fmt: skip
    t0 = time.perf_counter()
    run = dict(device=device, steps=a.steps, warmup=a.warmup, inner=a.inner, seed=a.seed,
               peak_flops=a.peak_flops, timeout_s=a.timeout, jax_overrides=jax_overrides,
               threads=a.threads, tokens=a.tokens, data_path=a.data)  # fmt: skip
    result["results"] = [bench_config(cfg, impls, **run) for cfg in cfgs]
    first = result["results"][0] if result["results"] else {}
    result.update(wall_s=time.perf_counter() - t0, loadavg_end=loadavg(),
                  peak_flops=first.get("peak_flops"), peak_flops_source=first.get("peak_flops_source"))  # fmt: skip
    (out_dir / JSON_NAME).write_text(json.dumps(result, indent=1, default=str))
    print(speed_markdown(result))
    print(f"wrote {out_dir / JSON_NAME}")
    return result


# ----------------------------------------------------------------------------------------------
# The tables (the console's, and docs/benchmarks.md's through bench/tables.py)


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def load_average(result: dict) -> str:
    def avg(x):
        return "n/a" if not x else "/".join(f"{v:.1f}" for v in x)

    start, end = avg(result.get("loadavg_start")), avg(result.get("loadavg_end"))
    return f"load average (1/5/15 min) {start} before, {end} after"


def table_head(columns: str) -> list[str]:
    return ["", f"| {columns.replace('|', ' | ')} |", "|" + "---|" * len(columns.split("|"))]


def speed_markdown(result: dict) -> str:
    """What a step-time record says: the command and machine, then one row per implementation
    (median [IQR], range, throughput, MFU, compile, peak memory) and one per paired ratio."""
    m, s = result["machine"], result["settings"]
    where = m["cpu"] if m["device"] == "cpu" else ", ".join(m["gpus"])
    peak = result.get("peak_flops")
    lines = [
        f"`{result['command']}` at {result['started_utc']} (git {m['git_commit']}); {where}, "
        f"{m['cpu_cores']} cores, threads per worker: {s.get('threads') or m['cpu_cores']}; "
        f"{load_average(result)}; peak for MFU {f'{peak:.3g}' if peak else 'unknown'} FLOP/s "
        f"({result.get('peak_flops_source')}); {s['steps']} timed rounds x {s['inner']} steps "
        f"after {s['warmup']} warm-up rounds.",
        *table_head(
            "config|impl|step ms median [IQR]|min-max ms|items/s|MFU|compile s|peak mem MiB"
        ),
    ]
    for rec in result["results"]:
        c = rec["config"]
        for impl, res in rec["impls"].items():
            t = res.get("step_time_s")
            if res["status"] != "ok" or not t:
                lines.append(f"| {c} | {impl} | error: {res.get('error', '')} | | | | | |")
                continue
            mem = res.get("memory", {})
            peak_bytes = mem.get("device_peak_bytes") or mem.get("peak_rss_bytes") or 0
            mfu = f"{res['mfu']:.1%}" if res.get("mfu") else "-"
            note = res.get("recompiles_during_timing")
            lines.append(
                f"| {c} | {impl} | {_ms(t['median'])} [{_ms(t['q1'])}-{_ms(t['q3'])}] "
                f"| {_ms(t['min'])}-{_ms(t['max'])} | {res['items_per_s']:.0f} {rec['unit']}/s "
                f"| {mfu} | {res['compile_s']:.1f} | {peak_bytes / 2**20:.0f}"
                f"{f' ({note} recompiles while timed!)' if note else ''} |"
            )
        for key, r in rec["ratios"].items():
            lines.append(f"| {c} | **{key}** | ratio {r['median']:.3f} [{r['q1']:.3f}-{r['q3']:.3f}] "
                         "| | | | | |")  # fmt: skip
    return "\n".join(lines)
