"""Side-by-side step-time benchmark: the JAX train step vs the PyTorch reference, eager and compiled.

    python -m bench [--configs a,b] [--impls jax,torch_eager,torch_compile] [--steps N]
                    [--warmup N] [--inner K] [--out DIR] [--device auto|cpu|gpu] [--peak-flops F]

The command line. How a config is run (workers interleaved round by round) is bench/speed.py;
the workers bench/worker.py; the tables and chart bench/report.py.

Writes <out>/bench.json, <out>/bench.png and prints the table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from bench import configs as bench_configs
from bench.machine import detect_device, gpu_names, loadavg, result_header
from bench.peak import resolve_peak_flops
from bench.report import format_table, write_chart
from bench.speed import bench_config

IMPLS = ("jax", "torch_eager", "torch_compile")
JSON_NAME = "bench.json"
PNG_NAME = "bench.png"


def parse_value(v: str):
    """A command-line model value: true/false, a JSON number/list, else the string itself
    (`attention_impl=explicit`)."""
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return json.loads(v)
    except ValueError:
        return v


def _parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"bench: --jax-model expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = parse_value(v)
    return out


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
        help="override a field on the JAX side only: a model field (scan=true, remat=true) or "
        "optim.NAME (optim.table_update=sparse)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU only: pin every worker to this many cores (default: all)",
    )
    p.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help="the data set the batch comes from (default: the experiment's data.path; without "
        "one on disk, a generator with its token statistics)",
    )
    p.add_argument(
        "--tokens",
        default="data",
        choices=("data", "uniform"),
        help="data: the data set's own batches (or its statistics); uniform: every token id "
        "equally likely (hides a contended embedding gradient)",
    )
    p.add_argument("--no-chart", action="store_true")
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    device = detect_device() if args.device == "auto" else args.device
    if device == "gpu" and not gpu_names():
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

    command = "python -m bench " + " ".join(shlex.quote(a) for a in argv)
    result = result_header("speed", command, device)
    result["settings"] = {
        "steps": args.steps,
        "warmup": args.warmup,
        "inner": args.inner,
        "seed": args.seed,
        "impls": impls,
        "threads": args.threads,
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
            tokens=args.tokens,
            data_path=args.data,
        )
        for cfg in cfgs
    ]
    result["wall_s"] = time.perf_counter() - t0
    result["loadavg_end"] = loadavg()
    (out_dir / JSON_NAME).write_text(json.dumps(result, indent=1, default=str))
    print(format_table(result))
    if not args.no_chart:
        write_chart(result, out_dir / PNG_NAME)
    print(f"wrote {out_dir / JSON_NAME}" + ("" if args.no_chart else f" and {out_dir / PNG_NAME}"))
    return result
