"""JAX-only A/B of step variants in ONE process, interleaved: compile time and step time.

    python -m bench.variants trm_sudoku_tiny --variant scan=true --variant scan=true,remat=true \
        [--steps 10] [--threads N] [--batch B] [--data-path DIR] [--device cpu|gpu] [--out FILE]
    python -m bench.variants gpt2_124m --device gpu --flags NAME=XLA_FLAGS [--flags ...]

A variant is the trainer's step built from the same experiment with JAX-side keys changed
(bench.configs.jax_override); each is lowered and compiled (timed apart), then the variants run
one step each in turn and each one's median is divided by the baseline's step by step.
`--flags` compares compiler flags instead: each set is a process of its own, run as `base, set 1,
..., set N, base`, each set's median over the mean of the two bases (their spread says what a
ratio is worth); a process that fails (an unknown flag aborts XLA) is recorded with its exit
code, and each set's record is printed as a `FLAGS {json}` line as it ends.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from train.errors import ConfigError, OneLineParser, user_errors


def main(argv=None):
    p = OneLineParser(prog="python -m bench.variants")
    p.add_argument("config")
    p.add_argument("--variant", action="append", default=[], help="k=v[,k=v] JAX-side overrides")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="the global batch (real sizes on CPU)")
    p.add_argument("--out", default=None, help="write the result JSON here")
    p.add_argument("--data-path", default=None, metavar="DIR", help="where the batch comes from")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--flags", action="append", default=[], metavar="NAME=XLA_FLAGS",
                   help="a set of XLA flags, timed in its own process against the default")  # fmt: skip
    args = p.parse_args(argv)
    if args.flags:
        if args.variant:
            p.error("--flags and --variant are separate runs: give one of them")
        return flag_sweep(args)
    from bench import configs, runners
    from bench.speed import paired_ratios, summarize
    from bench.worker import apply_config_xla_flags, prepare_env

    cfg = configs.get(args.config)
    if args.batch:
        batch = f"trainer.global_batch_size={args.batch}"
        cfg = dataclasses.replace(cfg, overrides=(*cfg.overrides, batch))
    variants = [[]] + [v.split(",") for v in args.variant]
    prepare_env("jax", args.device, args.threads)  # before jax loads
    # every variant composed and validated before anything is compiled
    resolved = [configs.resolve(cfg, jax_overrides=v, data_path=args.data_path) for v in variants]
    print(f"XLA_FLAGS: {apply_config_xla_flags(resolved[0])!r}", flush=True)  # the trainer's
    import jax

    built = []
    for ov, rc in zip(variants, resolved):
        r = runners.JaxRunner(rc, {"seed": 0, "device": args.device})
        r.setup()
        t0 = time.perf_counter()
        lowered = r.step_fn.lower(r.state, r.batch)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        state, m = compiled(r.state, r.batch)
        jax.block_until_ready(m)
        mem = compiled.memory_analysis()
        built.append({"overrides": dict(o.split("=", 1) for o in ov), "lower_s": t1 - t0,
                      "compile_s": t2 - t1,
                      "temp_bytes": getattr(mem, "temp_size_in_bytes", None) if mem else None,
                      "hlo_chars": len(lowered.as_text()), "fn": compiled, "state": state,
                      "batch": r.batch, "times": []})  # fmt: skip
    for _ in range(args.steps):
        for v in built:
            t0 = time.perf_counter()
            v["state"], m = v["fn"](v["state"], v["batch"])
            jax.block_until_ready(m)
            v["times"].append(time.perf_counter() - t0)
    rows = []
    for v in built:
        s, r = summarize(v["times"]), paired_ratios(v["times"], built[0]["times"])
        keep = ("overrides", "lower_s", "compile_s", "temp_bytes", "hlo_chars")
        rows.append({k: v[k] for k in keep} | {"step_time_s": s, "ratio_to_baseline": r})
        print(f"{json.dumps(v['overrides']):<36} lower {v['lower_s']:6.2f} s  compile "
              f"{v['compile_s']:6.2f} s  step {s['median'] * 1e3:8.2f} ms "
              f"[{s['q1'] * 1e3:.2f}-{s['q3'] * 1e3:.2f}]  x{r['median']:.3f} of baseline  "
              f"temp {(v['temp_bytes'] or 0) / 2**20:.1f} MiB  HLO {v['hlo_chars'] / 1e3:.0f}k chars")  # fmt: skip
    result = {"config": args.config, "device": args.device,
              "devices": [d.device_kind for d in jax.devices()[:1]], "threads": args.threads,
              "loadavg": os.getloadavg(), "rows": rows}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return result


def parse_flag_sets(items: list[str]) -> list[tuple[str, str]]:
    """["NAME=--xla_a=1 --xla_b", ...] -> [(NAME, "--xla_a=1 --xla_b")]; "base" is reserved."""
    out = []
    for item in items:
        name, sep, flags = item.partition("=")
        if not sep or not name or not flags.strip().startswith("--"):
            raise ConfigError(f"bench.variants: --flags {item!r}: expected NAME=--xla_flag[=V] ...")
        if name == "base" or name in dict(out):
            raise ConfigError(f"bench.variants: --flags {item!r}: the name {name!r} is taken")
        out.append((name, flags.strip()))
    return out


def flag_sweep(args) -> dict:
    """Each flag set in its own process, `base, sets..., base`; ratios to the mean base median."""
    runs = [("base", "")] + parse_flag_sets(args.flags) + [("base", "")]
    common = [args.config, "--device", args.device, "--steps", str(args.steps)]
    for opt in ("threads", "batch", "data_path"):
        if getattr(args, opt) is not None:
            common += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    records = []
    with tempfile.TemporaryDirectory(prefix="bench_flags_") as tmp:
        for i, (name, flags) in enumerate(runs):
            out = os.path.join(tmp, f"{i}.json")
            env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "bench.variants", *common, "--out", out],
                                  env=env, capture_output=True, text=True)  # fmt: skip
            rec = {"name": name, "flags": flags, "returncode": proc.returncode,
                   "wall_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
            if proc.returncode == 0:
                with open(out) as f:
                    row = json.load(f)["rows"][0]
                rec |= {"compile_s": row["compile_s"], "step_time_s": row["step_time_s"]}
            else:
                rec["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][-300:]
            records.append(rec)
            print("FLAGS " + json.dumps(rec), flush=True)
    base = [r["step_time_s"]["median"] for r in records if r["name"] == "base" and "compile_s" in r]
    base_ms = 1e3 * statistics.fmean(base) if base else None
    print(f"{'set':<20} {'compile s':>9} {'step ms':>9} {'x base':>7}  flags")
    for r in records:
        st = r.get("step_time_s")
        if st and base_ms:
            r["ratio_to_base"] = 1e3 * st["median"] / base_ms
        step = f"{1e3 * st['median']:9.2f}" if st else f"{'rc ' + str(r['returncode']):>9}"
        comp = f"{r['compile_s']:9.2f}" if st else f"{'-':>9}"
        ratio = f"{r['ratio_to_base']:7.3f}" if "ratio_to_base" in r else f"{'-':>7}"
        print(f"{r['name']:<20} {comp} {step} {ratio}  {r['flags'] or '(default)'}")
    result = {"config": args.config, "device": args.device, "base_ms": base_ms,
              "base_spread": (max(base) / min(base) - 1) if len(base) == 2 else None,
              "sets": records}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main(sys.argv[1:])
