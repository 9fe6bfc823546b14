"""Side-by-side step-time benchmark: the JAX train step vs the PyTorch reference, eager and compiled.

    python -m bench [--configs a,b] [--impls jax,torch_eager,torch_compile] [--steps N]
                    [--warmup N] [--inner K] [--out DIR] [--device auto|cpu|gpu] [--peak-flops F]

Each implementation lives in its own worker process (bench/worker.py) holding the model, the
optimiser state and ONE fixed batch on the device. The parent drives them in rounds: in every
round each worker runs K steps ending in a device sync while the others wait, in the same order
(A B C A B C ...). Round 0 is the first call (trace + compile + one step); `--warmup` more
rounds are thrown away; the next `--steps` rounds are timed. Ratios are taken round by round
(t_jax[r] / t_torch[r]) before the median, so drift of the machine between rounds cancels.

Writes <out>/bench.json, <out>/bench.png and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import configs as bench_configs
from bench import flops as bench_flops
from bench.worker import worker_main

IMPLS = ("jax", "torch_eager", "torch_compile")
JSON_NAME = "bench.json"
PNG_NAME = "bench.png"


# ----------------------------------------------------------------------------------------------
# Worker handles


class WorkerError(RuntimeError):
    pass


class Worker:
    """Parent-side handle of one implementation's process."""

    def __init__(self, spec: dict, timeout_s: float):
        self.spec = spec
        self.name = spec["impl"]
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, spec), daemon=True)
        self.proc.start()
        child.close()
        self.info = self._answer()

    def _answer(self):
        if not self.conn.poll(self.timeout_s):
            self.kill()
            raise WorkerError(f"{self.name}: no answer within {self.timeout_s:.0f} s")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.kill()
            raise WorkerError(
                f"{self.name}: worker died (exit code {self.proc.exitcode})"
            ) from None
        if status != "ok":
            raise WorkerError(payload)
        return payload

    def call(self, cmd: str, arg=None):
        self.conn.send((cmd, arg))
        return self._answer()

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.conn.send(("close", None))
                self.conn.poll(10)
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(10)
        self.kill()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def _short_error(text: str) -> str:
    """The `SomeError: message` line of a traceback (JAX appends notes after it)."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line):
            return line[:300]
    return lines[-1][:300] if lines else "error"


# ----------------------------------------------------------------------------------------------
# Statistics


def summarize(values: list[float]) -> dict:
    """Median, quartiles and range of a list of per-step times (seconds)."""
    if not values:
        return {}
    v = sorted(values)
    if len(v) >= 2:
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
    else:
        q1 = q3 = v[0]
    return {
        "median": statistics.median(v),
        "q1": q1,
        "q3": q3,
        "min": v[0],
        "max": v[-1],
        "n": len(v),
    }


def _paired_ratios(a: list[float], b: list[float]) -> dict:
    return summarize([x / y for x, y in zip(a, b) if y > 0])


# ----------------------------------------------------------------------------------------------
# Machine description


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_names() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return (
        [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0
        else []
    )


def _loadavg() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(device: str) -> dict:
    return {
        "device": device,
        "cpu": _cpu_model(),
        "cpu_cores": bench_flops.cpu_count(),
        "gpus": _gpu_names(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "torch", "numpy")},
        "git_commit": _git_commit(),
    }


# ----------------------------------------------------------------------------------------------
# Peak FLOP/s


def _peak_worker(conn, device: str, threads: int | None) -> None:
    from bench.worker import prepare_env

    prepare_env("jax", device, threads)
    try:
        if device == "gpu":
            import jax

            name = jax.devices()[0].device_kind
            conn.send(("ok", (bench_flops.peak_flops_for_device_name(name), f"preset for {name}")))
        else:
            peak = bench_flops.measure_cpu_peak_flops()
            cores = bench_flops.cpu_count()  # after prepare_env: the cores a worker may use
            src = f"measured: best fp32 1024^3 matmul through XLA on {cores} core(s)"
            conn.send(("ok", (peak, src)))
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", repr(e)))


def resolve_peak_flops(
    device: str, override: float | None, threads: int | None = None
) -> tuple[float | None, str]:
    if override:
        return override, "given by --peak-flops"
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_peak_worker, args=(child, device, threads), daemon=True)
    proc.start()
    status, payload = parent.recv() if parent.poll(300) else ("error", "timeout")
    proc.join(10)
    if status != "ok" or payload[0] is None:
        return None, f"unknown ({payload if status != 'ok' else payload[1]}); pass --peak-flops"
    return payload


# ----------------------------------------------------------------------------------------------
# The benchmark


def flops_per_step(rc: dict) -> int:
    """Analytic FLOPs of one train step of a resolved config (bench.flops)."""
    if rc["family"] == "gpt":
        return bench_flops.gpt_flops_per_step(rc["model"], rc["batch_size"])
    return bench_flops.trm_flops_per_step(rc["model"], rc["batch_size"])["total"]


def bench_config(
    cfg: bench_configs.BenchConfig,
    impls: list[str],
    *,
    device: str,
    steps: int,
    warmup: int,
    inner: int,
    seed: int,
    peak_flops: float | None,
    timeout_s: float,
    jax_overrides: dict,
    threads: int | None = None,
    log=print,
) -> dict:
    """Run one config's implementations interleaved; return its JSON record."""
    rc = bench_configs.resolve(cfg, seed=seed, jax_overrides=jax_overrides)
    flops = flops_per_step(rc)
    record = {
        "config": cfg.name,
        "family": rc["family"],
        "config_source": rc["source"],
        "batch_size": rc["batch_size"],
        "dtype": rc["dtype"],
        "model": rc["model"],
        "optim": rc["optim"],
        "unit": rc["unit"],
        "items_per_step": rc["items_per_step"],
        "flops_per_step": flops,
        "jax_overrides": jax_overrides,
        "threads": threads,
        "schedule": [],
        "impls": {},
        "ratios": {},
    }
    workers: dict[str, Worker] = {}
    for impl in impls:
        spec = {
            "impl": impl,
            "device": device,
            "config": cfg.name,
            "resolved": rc,
            "seed": seed,
            "threads": threads,
        }
        res = {"status": "ok"}
        record["impls"][impl] = res
        log(f"[{cfg.name}] starting {impl} ...")
        try:
            w = Worker(spec, timeout_s)
            workers[impl] = w
            res["info"] = w.info
        except WorkerError as e:
            res.update(status="error", error=_short_error(e), traceback=str(e))
            log(f"[{cfg.name}] {impl} failed at setup: {_short_error(e)}")

    times: dict[str, list[float]] = {name: [] for name in workers}
    losses: dict[str, list[float]] = {name: [] for name in workers}

    def one_round(n: int, timed: bool) -> None:
        for name in list(workers):
            record["schedule"].append(name)
            try:
                out = workers[name].call("run", n)
            except WorkerError as e:
                res = record["impls"][name]
                res.update(status="error", error=_short_error(e), traceback=str(e))
                log(f"[{cfg.name}] {name} failed: {_short_error(e)}")
                workers.pop(name).close()
                continue
            losses[name].append(out["loss"])
            if timed:
                times[name].append(out["seconds"] / n)
            elif "first_step_s" not in record["impls"][name]:
                record["impls"][name]["first_step_s"] = out["seconds"]

    one_round(1, timed=False)  # trace + compile + one step
    for _ in range(warmup):
        one_round(inner, timed=False)
    compiles_before = {}
    for name in list(workers):
        compiles_before[name] = workers[name].call("stats").get("compiles")
    for r in range(steps):
        one_round(inner, timed=True)
        if (r + 1) % max(1, steps // 4) == 0:
            log(f"[{cfg.name}] round {r + 1}/{steps}")

    for name, w in workers.items():
        res = record["impls"][name]
        stats = w.call("stats")
        w.close()
        t = summarize(times[name])
        res["step_time_s"] = t
        res["losses"] = losses[name]
        res["memory"] = stats
        if t:
            res["items_per_s"] = rc["items_per_step"] / t["median"]
            res["flops_per_s"] = flops / t["median"]
            res["mfu"] = flops / t["median"] / peak_flops if peak_flops else None
            res["compile_s"] = max(0.0, res["first_step_s"] - t["median"])
        before, after = compiles_before.get(name), stats.get("compiles")
        res["recompiles_during_timing"] = (
            after - before if before is not None and after is not None else None
        )
    if times.get("jax"):
        for other in ("torch_eager", "torch_compile"):
            if times.get(other):
                record["ratios"][f"jax/{other}"] = _paired_ratios(times["jax"], times[other])
    if times.get("torch_compile") and times.get("torch_eager"):
        record["ratios"]["torch_compile/torch_eager"] = _paired_ratios(
            times["torch_compile"], times["torch_eager"]
        )
    return record


# ----------------------------------------------------------------------------------------------
# Output


def _fmt_bytes(n) -> str:
    return "-" if not n else f"{n / 2**20:.0f}M"


def format_table(result: dict) -> str:
    head = (
        f"{'config':<26} {'impl':<14} {'step ms (median)':>16} {'IQR ms':>15} "
        f"{'items/s':>12} {'MFU':>7} {'compile s':>9} {'peak mem':>9}  note"
    )
    lines = [head, "-" * len(head)]
    for rec in result["results"]:
        for impl, res in rec["impls"].items():
            t = res.get("step_time_s") or {}
            if res["status"] != "ok" or not t:
                lines.append(
                    f"{rec['config']:<26} {impl:<14} {'ERROR':>16}  {res.get('error', '')}"
                )
                continue
            mem = res.get("memory", {})
            peak = mem.get("device_peak_bytes") or mem.get("peak_rss_bytes")
            mfu = res.get("mfu")
            note = ""
            if res.get("recompiles_during_timing"):
                note = f"{res['recompiles_during_timing']} recompiles while timed!"
            lines.append(
                f"{rec['config']:<26} {impl:<14} {t['median'] * 1e3:>16.2f} "
                f"{t['q1'] * 1e3:>7.2f}-{t['q3'] * 1e3:<7.2f} "
                f"{res['items_per_s']:>12.0f} {(f'{mfu:.1%}' if mfu else '-'):>7} "
                f"{res['compile_s']:>9.2f} {_fmt_bytes(peak):>9}  {note}"
            )
        for key, r in rec["ratios"].items():
            lines.append(
                f"{'':<26} {key:<28} step-time ratio (paired median) {r['median']:.3f} "
                f"[IQR {r['q1']:.3f}-{r['q3']:.3f}]"
            )
    return "\n".join(lines)


def write_chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = result["results"]
    fig, axes = plt.subplots(
        1, max(1, len(recs)), figsize=(4.5 * max(1, len(recs)), 4), squeeze=False
    )
    colors = {"jax": "#1f77b4", "torch_eager": "#ff7f0e", "torch_compile": "#2ca02c"}
    for ax, rec in zip(axes[0], recs):
        names, med, lo, hi = [], [], [], []
        for impl, res in rec["impls"].items():
            t = res.get("step_time_s")
            if not t:
                continue
            names.append(impl)
            med.append(t["median"] * 1e3)
            lo.append((t["median"] - t["q1"]) * 1e3)
            hi.append((t["q3"] - t["median"]) * 1e3)
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color=[colors.get(n, "gray") for n in names])
        ax.set_title(rec["config"], fontsize=10)
        ax.set_ylabel("ms per train step (median, IQR)")
        for i, m in enumerate(med):
            ax.text(i, m, f"{m:.1f}", ha="center", va="bottom", fontsize=8)
    m = result["machine"]
    where = m["cpu"] if m["device"] == "cpu" else ", ".join(m["gpus"])
    threads = result["settings"].get("threads") or m["cpu_cores"]
    load = result.get("loadavg_start")
    fig.suptitle(
        f"train step time on {m['device']} ({where}, {threads} threads"
        + (f", load {load[0]:.1f}" if load else "")
        + ")",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# CLI


def detect_device() -> str:
    return "gpu" if _gpu_names() else "cpu"


def _parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"bench: --jax-model expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = parse_value(v)
    return out


def parse_value(v: str):
    """A command-line model value: true/false, a JSON number/list, else the string itself
    (`attention_impl=explicit`)."""
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return json.loads(v)
    except ValueError:
        return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--configs", default=None, help="comma list; default: tiny on CPU, real on GPU")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma list from {IMPLS}")
    p.add_argument("--steps", type=int, default=10, help="timed rounds")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds after the first call")
    p.add_argument("--inner", type=int, default=5, help="steps per round (one sync per round)")
    p.add_argument("--out", default="bench_out", help="directory for bench.json and bench.png")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    p.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s for MFU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker answer")
    p.add_argument(
        "--jax-model",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model field on the JAX side only (e.g. scan=true, remat=true)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU only: pin every worker to this many cores (default: all)",
    )
    p.add_argument("--no-chart", action="store_true")
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    device = detect_device() if args.device == "auto" else args.device
    if device == "gpu" and not _gpu_names():
        raise SystemExit(
            "bench: --device gpu, but nvidia-smi lists no NVIDIA GPU on this machine "
            "(use --device cpu, or auto to pick what is there)"
        )
    names = (
        args.configs.split(",")
        if args.configs
        else list(bench_configs.GPU_DEFAULT if device == "gpu" else bench_configs.CPU_DEFAULT)
    )
    cfgs = [bench_configs.get(n.strip()) for n in names if n.strip()]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for i in impls:
        if i not in IMPLS:
            raise SystemExit(f"bench: unknown impl {i!r}; expected some of {IMPLS}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    result = {
        "kind": "speed",
        "command": "python -m bench " + " ".join(shlex.quote(a) for a in argv),
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": _loadavg(),
        "machine": machine_info(device),
        "settings": {
            "steps": args.steps,
            "warmup": args.warmup,
            "inner": args.inner,
            "seed": args.seed,
            "impls": impls,
            "threads": args.threads,
        },
    }
    peak, peak_src = resolve_peak_flops(device, args.peak_flops, args.threads)
    result["peak_flops"] = peak
    result["peak_flops_source"] = peak_src
    print(f"peak FLOP/s for MFU: {peak:.3g} ({peak_src})" if peak else f"peak FLOP/s: {peak_src}")
    t0 = time.perf_counter()
    result["results"] = [
        bench_config(
            cfg,
            impls,
            device=device,
            steps=args.steps,
            warmup=args.warmup,
            inner=args.inner,
            seed=args.seed,
            peak_flops=peak,
            timeout_s=args.timeout,
            jax_overrides=_parse_overrides(args.jax_model),
            threads=args.threads,
        )
        for cfg in cfgs
    ]
    result["wall_s"] = time.perf_counter() - t0
    result["loadavg_end"] = _loadavg()
    (out_dir / JSON_NAME).write_text(json.dumps(result, indent=1, default=str))
    table = format_table(result)
    print(table)
    if not args.no_chart:
        write_chart(result, out_dir / PNG_NAME)
    print(f"wrote {out_dir / JSON_NAME}" + ("" if args.no_chart else f" and {out_dir / PNG_NAME}"))
    return result
