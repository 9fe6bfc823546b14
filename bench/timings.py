"""What a new user waits for: `make demo` and `make test` from a fresh clone, each install timed
apart from its command, on a machine you name by its CPU.

    python -m bench timings --clone DIR [--cores 2] [--busy N] [--kernels avx2] [--parts demo,test]

In a fresh `git clone` of HEAD at DIR: `make .venv/bin/.installed-base`, `make demo` (an empty XLA
compilation cache, as a first run has), `make .venv/bin/.installed-dev` and `make test`, each
timed, on the first `--cores` cores; `--busy N` runs N busy loops on them meanwhile, `--kernels
avx2` gives XLA and torch AVX2 kernels on an AVX-512 CPU. Without --busy it refuses to start above
--max-load (the figures are a quiet machine's). pip reads its usual configuration
(`PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1`: everything from PyPI, recorded). Writes --out
(default bench/results/timings/<row>.json, a row of ROWS) and the commands' output beside it
(.log); the README's and docs/testing.md's timing tables are the records' (`python -m bench tables`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time

from bench.machine import loadavg, result_header
from train.errors import ConfigError, OneLineParser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "timings")
# The rows of the timing tables: record name -> what the row's first cell says
ROWS = {"avx2": "2 AVX2 cores, quiet", "avx512": "2 AVX-512 cores, quiet",
        "avx2-busy2": "2 AVX2 cores, 2 busy loops beside"}  # fmt: skip
NOT_MEASURED = "not measured yet"
AVX2_KERNELS = {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def cpu_isa() -> str:
    """The widest x86 vector kernels this CPU runs: AVX-512, AVX2 or other."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = []
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"


def row_name(isa: str, kernels: str, cores: int, busy: int) -> str:
    """The ROWS key of a measurement (ConfigError when no row shows it)."""
    kind = "avx2" if kernels == "avx2" or isa == "AVX2" else "avx512" if isa == "AVX-512" else ""
    name = f"{kind}-busy{busy}" if busy else kind
    if cores != 2 or name not in ROWS:
        raise ConfigError(f"no table row for {cores} {isa} cores ({kernels} kernels, {busy} busy "
                          f"loops): the rows are {list(ROWS.values())}; name --out yourself to "
                          "keep such a record")  # fmt: skip
    return name


def _pinned(cores: list[int]):
    return lambda: os.sched_setaffinity(0, cores)


def _timed(cmd: list[str], cwd: str, env: dict, cores: list[int], log) -> dict:
    load, t0 = loadavg(), time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                          preexec_fn=_pinned(cores))  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode:
        raise ConfigError(f"{shlex.join(cmd)} in {cwd} exited {done.returncode} (see {log.name})")
    return {"command": shlex.join(cmd), "wall_s": wall, "loadavg_start": load}


@contextlib.contextmanager
def busy_loops(n: int, cores: list[int]):
    """n processes spinning on `cores` while the body runs."""
    loop = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(loop, preexec_fn=_pinned(cores)) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


_SUMMARY = re.compile(r"^=+ (.*\d+ passed.*) in ([\d.]+)s")


def pytest_summary(text: str) -> dict:
    """The last pytest summary line of `text`: {"line", "passed", "seconds"}."""
    found = [m for line in text.splitlines() if (m := _SUMMARY.match(line.strip()))]
    if not found:
        raise ConfigError("make test printed no pytest summary line")
    m = found[-1]
    passed = int(re.search(r"(\d+) passed", m.group(1)).group(1))
    return {"line": m.group(0), "passed": passed, "seconds": float(m.group(2))}


def measure(clone: str, parts: list[str], cores: list[int], busy: int, kernels: str, out: str):
    if os.path.exists(clone):
        raise ConfigError(f"--clone {clone} exists; name a new directory")
    env = dict(os.environ)
    if kernels == "avx2":
        env.update(AVX2_KERNELS)
    clone = os.path.abspath(clone)
    subprocess.run(["git", "clone", "-q", REPO, clone], check=True)
    record = {"cores": len(cores), "busy_loops": busy, "cpu_isa": cpu_isa(), "kernels": kernels,
              "environment": {k: os.environ.get(k) for k in
                              ("PIP_CONFIG_FILE", "PIP_NO_CACHE_DIR", "TORCH_INDEX_URL")}}  # fmt: skip
    log_path = os.path.splitext(out)[0] + ".log"
    with open(log_path, "w") as log, busy_loops(busy, cores):
        if "demo" in parts:
            install = _timed(["make", ".venv/bin/.installed-base"], clone, env, cores, log)
            log.write("=== make demo ===\n")
            log.flush()
            cache = f"DEMO_ARGS=run.compilation_cache_dir={clone}/.xla-cache"
            demo = _timed(["make", "demo", cache], clone, env, cores, log)
            with open(log_path) as f:
                lines = f.read().split("=== make demo ===\n", 1)[1].count("\n")
            record["demo"] = {"install": install, "run": {**demo, "output_lines": lines}}
        if "test" in parts:
            log.write("=== make test ===\n")
            log.flush()
            install = _timed(["make", ".venv/bin/.installed-dev"], clone, env, cores, log)
            test = _timed(["make", "test"], clone, env, cores, log)
            with open(log_path) as f:
                summary = pytest_summary(f.read().split("=== make test ===\n", 1)[1])
            record["test"] = {"install": install, "run": {**test, "pytest": summary}}
    record["loadavg_end"] = loadavg()
    return record


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds} s" if seconds < 100 else f"{seconds // 60}m{seconds % 60:02d}s"


def cells(record: dict | None) -> tuple[str, str]:
    """The `make demo` and `make test` cells of a record's row."""
    if record is None:
        return NOT_MEASURED, NOT_MEASURED
    out = []
    for part in ("demo", "test"):
        r = record.get(part)
        if r is None:
            out.append(NOT_MEASURED)
            continue
        install = r["install"]["wall_s"]
        if part == "test" and "demo" in record:  # make test installs the demo's install too
            install += record["demo"]["install"]["wall_s"]
        text = f"install {_duration(install)}, then {_duration(r['run']['wall_s'])}"
        if part == "test":
            text += f" ({r['run']['pytest']['passed']} passed)"
        out.append(text)
    if record.get("kernels") == "avx2" and record.get("cpu_isa") == "AVX-512":
        out[0] += " (AVX2 kernels on an AVX-512 CPU)"
    return out[0], out[1]


def records() -> dict:
    """ROWS key -> its record (None where not measured yet)."""
    paths = {name: os.path.join(RESULTS, f"{name}.json") for name in ROWS}
    return {n: json.load(open(p)) if os.path.exists(p) else None for n, p in paths.items()}


def main(argv: list[str] | None = None) -> dict | None:
    p = OneLineParser(prog="python -m bench timings", description=__doc__.split("\n\n")[0])
    p.add_argument("--clone", metavar="DIR", help="the fresh clone to make (must not exist)")
    p.add_argument("--parts", default="demo,test", help="demo, test or both (default)")
    p.add_argument("--cores", type=int, default=None, help="run on the first N cores")
    p.add_argument("--busy", type=int, default=0, metavar="N", help="N busy loops beside")
    p.add_argument("--kernels", choices=("native", "avx2"), default="native")
    p.add_argument("--max-load", type=float, default=0.5, help="refuse above this load average")
    p.add_argument("--out", default=None, help="default bench/results/timings/<row>.json")
    a = p.parse_args(argv)
    if not a.clone:
        raise ConfigError("expected --clone DIR")
    parts = a.parts.split(",")
    if not parts or set(parts) - {"demo", "test"}:
        raise ConfigError(f"--parts {a.parts}: expected demo, test or demo,test")
    allowed = sorted(os.sched_getaffinity(0))
    cores = allowed[: a.cores or len(allowed)]
    load = (loadavg() or [0.0])[0]
    if not a.busy and load > a.max_load:
        raise ConfigError(f"the 1-minute load average is {load:.2f} (> --max-load {a.max_load}): "
                          "the figures would not be a quiet machine's; wait, or raise --max-load "
                          "and say so")  # fmt: skip
    row = row_name(cpu_isa(), a.kernels, len(cores), a.busy)
    out = a.out or os.path.join(RESULTS, f"{row}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    command = "python -m bench timings " + shlex.join(argv if argv is not None else sys.argv[1:])
    result = {**result_header("timings", command, "cpu"),
              **measure(a.clone, parts, cores, a.busy, a.kernels, out)}  # fmt: skip
    with open(out, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}: make demo {cells(result)[0]}; make test {cells(result)[1]}")
    return result
