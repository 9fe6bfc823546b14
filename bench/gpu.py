"""One GPU session's whole plan in one command, every part time-boxed: `python -m bench gpu`.

    python -m bench gpu [--out DIR] [--work DIR] [--assets DIR] [--budget-s S] [--steps a,b,c,d,e]
                        [--parts KEY,KEY] [--box PART=S ...] [--cap STEP=S ...] [--dry-run]
    python -m bench gpu prepare --data DIR [--assets DIR]   # the data sets the parts read (once)
    python -m bench gpu env                                   # one line: device, driver, versions
    python -m bench gpu sudoku-data --src DIR [--test-csv F] --num-aug N --out DIR

The plan (docs/benchmarks.md, "What a GPU session runs"); the parts run in `plan()`'s order,
which is by priority (what answers the open questions first), not by step letter:

  a  the environment in one line; `pytest -m gpu` on the test files that hold gpu-marked tests;
     `python -m parity gpt --dtype bfloat16 --device cuda` (GPU kernels on both sides)
  b  Sudoku-Extreme 1k x 1000 augmentations built on the device (trm_sudoku's data); on it
     `python -m bench trainer` (the trainer's loop against its bare jitted step on the trainer's
     own batches: `trainer_over_bare`) and `python -m bench` on trm_sudoku fed those batches (JAX
     vs our PyTorch reference, eager and torch.compile, interleaved); `python -m bench` on
     gpt2_124m
  c  where the time goes: `bench.profile` of trm_sudoku (real batches) and gpt2_124m, the JAX step
     per XLA op and the torch.compile step per CUDA kernel
  d  what could close the gaps to torch.compile: JAX step variants behind config keys
     (`bench.variants --variant`, VARIANTS) and XLA:GPU flag sets (`--flags`, FLAG_SETS); and
     `bench.early_curve`: upstream's pretrain.py and our step, trm_sudoku's first 50 steps from
     the same weights on the same batches, the losses side by side
  e  gpt_shakespeare_char to val loss <= 1.47 from a cold start, and nanoGPT's own train.py to the
     same target on the same GPU

Every part is one process group with a time box, capped by what is left of its step's cap and of
the whole budget (--budget-s). When a part ends (exit, a target reached, its box, or a failure)
one JSON line goes to OUT/results.jsonl (status ok | failed | timeout | skipped, exit code,
seconds, box, command, what it measured), its output has already gone to OUT/<step>.log line by
line, and OUT/summary.md is rewritten. A timeout, of a part or of the whole call, keeps everything
done before it; the next part runs whatever the last one did. OUT gets 8 files (results.jsonl,
summary.md, a.log .. e.log, hlo.tar with the JAX profiles' HLO): a GPU loan brings back at most 8.

Inputs come from ASSETS (default `.gpu`, git-ignored; `bash bench/gpu_prepare.sh` fills it):
upstream/{nanoGPT,TinyRecursiveModels,adam-atan2} (checkout files; upstream/COMMITS),
data/shakespeare_char (our builder's bins), data/sudoku-tiny-30u (trm_sudoku_tiny's data as the
trainer builds it), data/sudoku-extreme-1k-train-only (upstream layout) and
data/sudoku-hard-test-1k/test.csv. A part whose input is missing is recorded as skipped, naming it.

--dry-run: the same parts on the CPU with the tiny configs, a few steps and short boxes (about two
minutes; tests/test_bench_gpu.py runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import queue
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from train.errors import user_errors

REPO = Path(__file__).resolve().parent.parent
RESULTS = "results.jsonl"
SUMMARY = "summary.md"
STEPS = ("a", "b", "c", "d", "e")
PAPER_TRM_STEPS = (
    65104  # 50,000 epochs x 1000 groups / batch 768 (configs/experiment/trm_sudoku.yaml)
)
TARGET_VAL_LOSS = 1.47  # nanoGPT README: 1.4697 for config/train_shakespeare_char.py
TRAINER_STEPS = (2, 12)  # (warm-up, timed) steps of each `bench trainer` side
# The TRM parts share one persistent compilation cache: `bench trainer`'s two sides, the JAX
# profile and the bench's JAX worker build the same default step (a cache load after the first)
TRM_CACHE = "xla-cache-trm"

# d: JAX step variants timed against the default in one process (`bench.variants --variant`),
# each a config key that exists on main; and XLA:GPU flag sets, each in its own process
# (`bench.variants --flags`, base runs before and after)
VARIANTS = {
    # log_softmax: the default's control (gpt2_124m's config picks logsumexp)
    "gpt2_124m": ("cross_entropy_impl=log_softmax", "optim.adamw_flat=true", "attention_impl=xla"),
    "trm_sudoku": ("split_gate_up=true", "loss_dtype=float32"),
}
NO_TRITON_GEMM = "no_triton_gemm=--xla_gpu_enable_triton_gemm=false"
FLAG_SETS = {
    "gpt2_124m": ("cudnn_layer_norm=--xla_gpu_enable_cudnn_layer_norm=true",),
    # the default's control: trm_sudoku's config turns Triton GEMMs off, a set's XLA_FLAGS win
    "trm_sudoku": ("triton_gemm=--xla_gpu_enable_triton_gemm=true",),
    "trm_sudoku_att": (NO_TRITON_GEMM,),
}
EARLY_CURVE_STEPS = 50
VARIANT_STEPS = 20  # timed steps of each variant (and of each flag set's process)
PROFILE_STEPS = 3

# Seconds. A part's box is capped by what is left of its step's cap and of the budget.
GPU_BOXES = {
    "a.env": 30,
    "a.parity_gpt": 40,
    "b.data": 60,
    "b.trainer": 110,
    "b.trm_sudoku": 150,
    "b.gpt2_124m": 120,
    "e.jax_cold": 90,
    "e.upstream": 90,
    "a.pytest": 60,
    "d.trm_sudoku_flags": 80,
    "d.gpt2_124m_flags": 130,
    "d.trm_sudoku_att_flags": 120,
    "d.gpt2_124m_variants": 170,
    "c.trm_sudoku_jax": 80,
    "c.gpt2_124m_jax": 60,
    "c.trm_sudoku_torch_compile": 120,
    "c.gpt2_124m_torch_compile": 80,
    "d.trm_sudoku_variants": 130,
    "d.early_curve": 100,
}
GPU_STEP_CAPS = {"a": 100}
GPU_BUDGET_S = 560
DRY_BOXES = {
    "a.env": 15,
    "b.gpt2_124m": 20,
    "d.trm_sudoku_att_flags": 30,
    "b.data": 10,
    "b.trainer": 25,
    "c.trm_sudoku_jax": 15,
    "c.trm_sudoku_torch_compile": 30,
    "c.gpt2_124m_jax": 15,
    "c.gpt2_124m_torch_compile": 30,
    "d.trm_sudoku_flags": 30,
    "d.trm_sudoku_variants": 20,
    "d.early_curve": 30,
    "d.gpt2_124m_variants": 20,
    "d.gpt2_124m_flags": 30,
    "e.jax_cold": 20,
    "e.upstream": 20,
    "a.pytest": 20,
    "a.parity_gpt": 20,
    "b.trm_sudoku": 20,
}
DRY_STEP_CAPS = {"a": 35}
DRY_BUDGET_S = 150
MIN_BOX_S = 5.0  # a part with less time than this left is skipped ("no time left")

# what the dry run runs instead (the CPU stand-ins of each GPU size)
DRY_CONFIG = {
    "trm_sudoku": "trm_sudoku_tiny",
    "trm_sudoku_att": "trm_sudoku_tiny",
    "gpt2_124m": "gpt_shakespeare_char_tiny",
}
DRY_TARGET_VAL_LOSS = 3.3  # gpt_shakespeare_char_tiny: 3.08 at step 20 on tiny-shakespeare
DRY_EVAL_INTERVAL = 20
# nanoGPT README's CPU recipe, shortened to the dry run's size (bench/curves.py has the full one)
DRY_NANOGPT_ARGS = (
    "--device=cpu",
    "--compile=False",
    "--eval_iters=5",
    f"--eval_interval={DRY_EVAL_INTERVAL}",
    "--warmup_iters=20",  # as gpt_shakespeare_char_tiny (config/train_shakespeare_char.py: 100)
    "--log_interval=10",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=300",
    "--lr_decay_iters=300",
    "--dropout=0.0",
)

TRAINER_QUIET = (
    "logging.wandb=disabled",
    "trainer.progress_bar=false",
    "run.compilation_cache_dir=null",  # every run compiles, as a first run does
)


# ----------------------------------------------------------------------------------------------
# Running one part: a process group with a box, its output streamed to the step's log


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_boxed(cmd, *, box_s: float, log, cwd=REPO, env=None, on_line=None):
    """Run `cmd` in its own process group for at most `box_s` seconds; every output line goes to
    the open file `log` as it comes and to `on_line(t, line)` (seconds since start), which returns
    True to stop the run there. -> (exit code, seconds, how it ended: "exit" | "stopped" | "box").
    Whatever way it ends, the whole group is killed: no process outlives its part."""
    t0 = time.monotonic()
    log.write(f"$ {shlex.join(str(c) for c in cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        bufsize=1,
        # its own process group, to kill it whole; not its own session, so that whatever ends
        # the driver's session (a GPU loan's command returning) ends the part as well
        process_group=0,
    )
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    ended = "exit"
    try:
        while True:
            left = box_s - (time.monotonic() - t0)
            try:
                line = lines.get(timeout=left) if left > 0 else None
            except queue.Empty:
                line = None
            if line is None and time.monotonic() - t0 >= box_s:
                ended = "box"
                break
            if line is None:  # the output closed: the process is ending
                try:
                    proc.wait(timeout=max(box_s - (time.monotonic() - t0), 0.01))
                except subprocess.TimeoutExpired:
                    ended = "box"
                break
            log.write(line)
            log.flush()
            if on_line is not None and on_line(time.monotonic() - t0, line.rstrip("\n")):
                ended = "stopped"
                break
    finally:  # also when the driver itself is stopped (SIGTERM, Ctrl-C)
        _kill_group(proc)
        rc = proc.wait()
    return rc, time.monotonic() - t0, ended


# ----------------------------------------------------------------------------------------------
# The parts


@dataclasses.dataclass
class Ctx:
    """What every part may read: where things are, the mode, the records written so far."""

    out: Path
    work: Path
    assets: Path
    dry_run: bool
    python: str = sys.executable
    records: dict = dataclasses.field(default_factory=dict)  # "a.env" -> its record

    def asset(self, *parts: str) -> Path:
        return self.assets.joinpath(*parts)


class Part:
    """One process of the plan. Subclasses say what to run, what to watch in its output and what
    it measured; `missing()` names an input that is not there (the part is then skipped)."""

    ok_at_box = False  # reaching its box is how this part ends (a throughput window)
    needs: tuple[str, ...] = ()  # parts that must have ended "ok" first

    def __init__(self, step: str, name: str):
        self.step, self.name = step, name
        self.lines: list[tuple[float, str]] = []

    @property
    def key(self) -> str:
        return f"{self.step}.{self.name}"

    def missing(self, ctx: Ctx) -> str | None:
        return None

    def command(self, ctx: Ctx) -> list[str]:
        raise NotImplementedError

    def env(self, ctx: Ctx) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1", WANDB_MODE="disabled")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        # a run under pytest would inherit the suite's fake CPU devices (tests/conftest.py)
        flags = env.get("XLA_FLAGS", "").split()
        env["XLA_FLAGS"] = " ".join(f for f in flags if "host_platform_device_count" not in f)
        if ctx.dry_run:
            env["JAX_PLATFORMS"] = "cpu"
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def watch(self, t: float, line: str) -> bool:
        return False

    def on_line(self, t: float, line: str) -> bool:
        self.lines.append((t, line))
        return self.watch(t, line)

    def result(self, ctx: Ctx, rc: int, ended: str) -> dict:
        return {}

    def headline(self, result: dict) -> str:
        return ""


def _py(ctx: Ctx, *args) -> list[str]:
    return [ctx.python, *map(str, args)]


class EnvPart(Part):
    def command(self, ctx):
        return _py(ctx, "-m", "bench", "gpu", "env")

    def env(self, ctx):
        return {**super().env(ctx), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

    def result(self, ctx, rc, ended):
        for _, line in reversed(self.lines):
            if line.startswith("ENV {"):
                return json.loads(line[4:])
        return {}

    def headline(self, r):
        return r.get("line", "")


def gpu_test_files() -> list[str]:
    """The test files that hold gpu-marked tests (pytest -m gpu collects only from these: the
    other files need not even import)."""
    return sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").glob("test_*.py")
        if "mark.gpu" in p.read_text()
    )


class PytestPart(Part):
    _SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")

    def command(self, ctx):
        return _py(ctx, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                   *gpu_test_files())  # fmt: skip

    def env(self, ctx):
        return {**super().env(ctx), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

    def result(self, ctx, rc, ended):
        counts = {}
        for _, line in self.lines[-5:]:
            if " in " in line and self._SUMMARY.search(line):
                counts = {k.rstrip("s"): int(n) for n, k in self._SUMMARY.findall(line)}
        return {"files": gpu_test_files(), "counts": counts}

    def headline(self, r):
        return ", ".join(f"{n} {k}" for k, n in r.get("counts", {}).items())


class ParityPart(Part):
    """a: `python -m parity gpt --dtype bfloat16 --device cuda`: nanoGPT module by module, torch's
    GPU kernels (flash SDPA, cuBLAS, autocast) against the port's (cuDNN attention), with the
    CPU's bf16 tolerance."""

    _COUNTS = re.compile(r"^(\d+) passed, (\d+) failed$")

    def command(self, ctx):
        return _py(ctx, "-m", "parity", "gpt", "--dtype", "bfloat16", "--device",
                   "cpu" if ctx.dry_run else "cuda")  # fmt: skip

    def env(self, ctx):
        return {**super().env(ctx), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

    def result(self, ctx, rc, ended):
        out: dict = {"rows": []}
        for _, line in self.lines:
            parts = line.split()
            if m := self._COUNTS.match(line.strip()):
                out["passed"], out["failed"] = int(m.group(1)), int(m.group(2))
            elif line.startswith("nanoGPT parity,"):
                out["head"] = line
            elif len(parts) >= 7 and parts[-1] in ("pass", "FAIL", "fail"):
                out["rows"].append(line)
        return out if "passed" in out else {}

    def headline(self, r):
        bad = [row.split()[0] for row in r["rows"] if row.split()[-1] != "pass"]
        return f"{r['passed']} passed, {r['failed']} failed" + (
            f": {', '.join(bad)}" if bad else ""
        )


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by the kill
            pass
    return rows


_FIRST_STEP = re.compile(r"first step done ([\d.]+) s after the trainer started")
_STEP_LINE = re.compile(r"^step (\d+): (.*)$")


class TrainerRun(Part):
    """`python -m train.main +experiment=X` with the run directory under WORK/runs."""

    experiment = ""

    def run_dir(self, ctx) -> Path:
        return ctx.work / "runs" / self.key

    def overrides(self, ctx) -> list[str]:
        return []

    def command(self, ctx):
        shutil.rmtree(self.run_dir(ctx), ignore_errors=True)  # a left-over run would resume
        return _py(ctx, "-m", "train.main", f"+experiment={self.experiment}", *TRAINER_QUIET,
                   f"run.out_dir={self.run_dir(ctx).parent}", f"run.name={self.key}",
                   *self.overrides(ctx))  # fmt: skip

    def trainer_facts(self, ctx) -> dict:
        rows = _read_jsonl(self.run_dir(ctx) / "metrics.jsonl")
        train = [r for r in rows if "step_time_ms" in r]
        evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
        first = next((float(m.group(1)) for _, ln in self.lines if (m := _FIRST_STEP.search(ln))),
                     None)  # fmt: skip
        out = {"first_step_s": first, "steps": max((r["step"] for r in train), default=0)}
        if train:
            later = [r["step_time_ms"] for r in train[1:]] or [train[0]["step_time_ms"]]
            out["step_time_ms_median"] = statistics.median(later)
            if "mfu" in train[-1]:
                out["mfu_median"] = statistics.median(r.get("mfu", 0.0) for r in train[1:] or train)
            out["last_train"] = train[-1]
        if evals:
            out["last_eval"] = evals[-1]
        return out


class _StepPart(Part):
    """A part on one bench config (its CPU stand-in in a dry run); a TRM config is fed batches of
    the Sudoku set b.data built and shares the TRM parts' compilation cache."""

    def __init__(self, step, name, config):
        super().__init__(step, name)
        self.config = config
        self.needs = ("b.data",) if config.startswith("trm") else ()

    def config_for(self, ctx) -> str:
        return DRY_CONFIG[self.config] if ctx.dry_run else self.config

    def data_args(self, ctx, flag: str) -> list:
        return [flag, ctx.work / SUDOKU_DIR] if self.needs else []

    def device(self, ctx) -> str:
        return "cpu" if ctx.dry_run else "gpu"

    def env(self, ctx):
        env = super().env(ctx)
        if self.needs:
            env["JAX_COMPILATION_CACHE_DIR"] = str(ctx.work / TRM_CACHE)
        return env


class BenchPart(_StepPart):
    """`python -m bench` on one config (its own invocation, so one config's timeout keeps the
    other's results); a TRM config is fed batches of the Sudoku set b.data built."""

    def __init__(self, step, config):
        super().__init__(step, config, config)

    def out_dir(self, ctx) -> Path:
        return ctx.work / f"bench-{self.config}"

    def command(self, ctx):
        shutil.rmtree(self.out_dir(ctx), ignore_errors=True)
        args = ["--device", self.device(ctx), "--configs", self.config_for(ctx)]
        if ctx.dry_run:
            args += ["--impls", "jax,torch_eager", "--steps", "2", "--warmup", "0", "--inner", "1",
                     "--peak-flops", "1e11"]  # fmt: skip
        args += self.data_args(ctx, "--data")
        # a worker that does not answer within this (torch.compile's first call, say) is recorded
        # as failed and the others go on: bench.json is written only at the end
        timeout = max(20, int(0.6 * self.box))
        return _py(ctx, "-m", "bench", *args, "--no-chart", "--timeout", timeout,
                   "--out", self.out_dir(ctx))  # fmt: skip

    def result(self, ctx, rc, ended):
        path = self.out_dir(ctx) / "bench.json"
        if not path.exists():
            return {}
        full = json.loads(path.read_text())
        rows = []
        for res in full.get("results", []):
            for impl, v in res.get("impls", {}).items():
                st = v.get("step_time_s") or {}
                rows.append({"config": res["config"], "impl": impl, "status": v.get("status"),
                             "step_ms_median": 1e3 * st["median"] if st else None,
                             "items_per_s": v.get("items_per_s"), "mfu": v.get("mfu"),
                             "compile_s": v.get("compile_s"), "error": v.get("error")})  # fmt: skip
            for name, r in (res.get("ratios") or {}).items():
                rows.append({"config": res["config"], "ratio": name, "median": r.get("median"),
                             "q1": r.get("q1"), "q3": r.get("q3")})  # fmt: skip
        return {"peak_flops": full.get("peak_flops"),
                "peak_flops_source": full.get("peak_flops_source"), "table": rows, "bench": full}  # fmt: skip

    def headline(self, r):
        bits = []
        for row in r.get("table", []):
            if "impl" in row and row.get("step_ms_median"):
                mfu = f", MFU {100 * row['mfu']:.1f}%" if row.get("mfu") else ""
                bits.append(f"{row['impl']} {row['step_ms_median']:.1f} ms{mfu}")
            elif "impl" in row:
                bits.append(f"{row['impl']} {row.get('status')}")
            elif row.get("median"):
                bits.append(f"{row['ratio']} {row['median']:.3f}")
        return "; ".join(bits)


class TargetRun(Part):
    """c: a whole run stopped at its first evaluation at or below the target val loss."""

    def __init__(self, step, name):
        super().__init__(step, name)
        self.evals: list[dict] = []
        self.target = TARGET_VAL_LOSS

    def missing(self, ctx):
        if not (ctx.asset("data", "shakespeare_char") / "train.bin").exists():
            return f"{ctx.asset('data', 'shakespeare_char')}/train.bin (bash bench/gpu_prepare.sh)"
        return None

    def add_eval(self, t, step, value) -> bool:
        self.evals.append({"step": step, "value": value, "t": round(t, 2)})
        return value <= self.target

    def result(self, ctx, rc, ended):
        hit = next((e for e in self.evals if e["value"] <= self.target), None)
        best = min(self.evals, key=lambda e: e["value"]) if self.evals else None
        return {"target": self.target, "reached": hit is not None,
                "time_to_target_s": hit["t"] if hit else None,
                "step_at_target": hit["step"] if hit else None, "best": best, "evals": self.evals}  # fmt: skip

    def headline(self, r):
        if r.get("reached"):
            return f"val loss {r['best']['value']:.4f} <= {r['target']} at step {r['step_at_target']}, {r['time_to_target_s']:.1f} s"
        b = r.get("best")
        return f"target {r.get('target')} not reached" + (
            f"; best {b['value']:.4f} at step {b['step']} ({b['t']:.0f} s)" if b else ""
        )


class JaxTargetRun(TargetRun, TrainerRun):
    """e: gpt_shakespeare_char to the target from a cold start: the persistent compilation cache
    in WORK/xla-cache emptied first, so start-up and every compile count, as for a first run."""

    def command(self, ctx):
        self.experiment = "gpt_shakespeare_char_tiny" if ctx.dry_run else "gpt_shakespeare_char"
        if ctx.dry_run:
            self.target = DRY_TARGET_VAL_LOSS
        self._metrics = self.run_dir(ctx) / "metrics.jsonl"
        shutil.rmtree(ctx.work / "xla-cache", ignore_errors=True)
        cmd = TrainerRun.command(self, ctx)
        return [c for c in cmd if c != "run.compilation_cache_dir=null"]  # TRAINER_QUIET's

    def overrides(self, ctx):
        out = [f"data.path={ctx.asset('data', 'shakespeare_char')}",
               f"run.compilation_cache_dir={ctx.work / 'xla-cache'}"]  # fmt: skip
        if ctx.dry_run:
            out += [f"trainer.eval_interval={DRY_EVAL_INTERVAL}", "data.eval_iters=5"]
        return out

    def watch(self, t, line):
        m = _STEP_LINE.match(line)
        if not m or "eval/val_loss" not in m.group(2):
            return False
        step = int(m.group(1))
        # the exact value: metrics.jsonl gets the record before the console line is printed
        row = next((r for r in reversed(_read_jsonl(self._metrics))
                    if r.get("step") == step and "eval/val_loss" in r), None)  # fmt: skip
        return row is not None and self.add_eval(t, step, float(row["eval/val_loss"]))

    def result(self, ctx, rc, ended):
        return {**TargetRun.result(self, ctx, rc, ended), **self.trainer_facts(ctx)}


_NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


class NanoGPTTargetRun(TargetRun):
    """e: nanoGPT's own train.py (config/train_shakespeare_char.py as it is; torch.compile on, as
    the recipe has it) to the same target on the same GPU and data, from a cold start."""

    def __init__(self, step):
        super().__init__(step, "upstream")

    def src(self, ctx) -> Path:
        return ctx.asset("upstream", "nanoGPT")

    def missing(self, ctx):
        if not (self.src(ctx) / "train.py").exists():
            return f"{self.src(ctx)}/train.py (bash bench/gpu_prepare.sh --nanogpt SRC)"
        return super().missing(ctx)

    def env(self, ctx):
        # cold, as the JAX run: inductor and triton otherwise reuse kernels from earlier runs
        fresh = ctx.work / "e-inductor-cache"
        shutil.rmtree(fresh, ignore_errors=True)
        return {**super().env(ctx), "TORCHINDUCTOR_CACHE_DIR": str(fresh),
                "TRITON_CACHE_DIR": str(fresh / "triton")}  # fmt: skip

    def command(self, ctx):
        if ctx.dry_run:
            self.target = DRY_TARGET_VAL_LOSS
        out = ctx.work / "e-nanogpt"
        shutil.rmtree(out, ignore_errors=True)
        args = DRY_NANOGPT_ARGS if ctx.dry_run else ()  # on a GPU: the config file's own settings
        return _py(ctx, "-m", "bench.upstream_runs", "nanogpt", "--src", self.src(ctx),
                   "--data", ctx.asset("data", "shakespeare_char"), "--seed", 1337, "--out", out,
                   "--", *args, f"--out_dir={out / 'out'}")  # fmt: skip

    def watch(self, t, line):
        m = _NANOGPT_EVAL.match(line)
        return bool(m) and self.add_eval(t, int(m.group(1)), float(m.group(3)))


class TrainerVsBarePart(Part):
    """b: `python -m bench trainer` on trm_sudoku (trm_sudoku_tiny in a dry run) with the Sudoku
    set b.data built: the trainer's loop against its bare jitted step."""

    needs = ("b.data",)

    def env(self, ctx):
        return {**super().env(ctx), "JAX_COMPILATION_CACHE_DIR": str(ctx.work / TRM_CACHE)}

    def command(self, ctx):
        experiment = "trm_sudoku_tiny" if ctx.dry_run else "trm_sudoku"
        warmup, steps = (1, 4) if ctx.dry_run else TRAINER_STEPS
        return _py(ctx, "-m", "bench", "trainer", f"+experiment={experiment}",
                   f"data.path={ctx.work / SUDOKU_DIR}", "--steps", steps, "--warmup", warmup)  # fmt: skip

    def result(self, ctx, rc, ended):
        for _, line in reversed(self.lines):
            if line.startswith("TRAINER_VS_BARE {"):
                r = json.loads(line[len("TRAINER_VS_BARE ") :])
                r["projected_h"] = PAPER_TRM_STEPS * r["trainer_s_per_step"] / 3600
                return r
        return {}

    def headline(self, r):
        return (f"trainer {1e3 * r['trainer_s_per_step']:.1f} ms/step, bare "
                f"{1e3 * r['bare_s_per_step']:.1f} ms/step, trainer_over_bare "
                f"{r['trainer_over_bare']:.3f}; {PAPER_TRM_STEPS} steps ~ {r['projected_h']:.1f} h")  # fmt: skip


SUDOKU_DIR = "sudoku-extreme-1k"


class SudokuDataPart(Part):
    def src(self, ctx) -> Path:
        return ctx.asset("data", "sudoku-extreme-1k-train-only")

    def missing(self, ctx):
        if not (self.src(ctx) / "train" / "dataset.json").exists():
            return f"{self.src(ctx)}/train/dataset.json (bash bench/gpu_prepare.sh --data DIR)"
        return None

    def command(self, ctx):
        # train split only: the runs on it measure steps, and without a test split the trainer's
        # closing evaluation (a compile of its own per variant) is skipped
        args = ["--src", self.src(ctx), "--num-aug", 2 if ctx.dry_run else 1000,
                "--out", ctx.work / SUDOKU_DIR]  # fmt: skip
        return _py(ctx, "-m", "bench", "gpu", "sudoku-data", *args)

    def result(self, ctx, rc, ended):
        for _, line in reversed(self.lines):
            if line.startswith("SUDOKU {"):
                return json.loads(line[7:])
        return {}

    def headline(self, r):
        tr = r.get("train") or {}
        return f"{tr.get('examples')} train examples in {r.get('seconds', 0):.1f} s"


class EarlyCurvePart(_StepPart):
    """d: `python -m bench.early_curve`: upstream's pretrain.py and our Task.train_step, the first
    EARLY_CURVE_STEPS steps of trm_sudoku from upstream's initial weights on upstream's batches
    (b.data's set) and exploration draws; the losses side by side (a sanity check at full size)."""

    def __init__(self, step, config):
        super().__init__(step, "early_curve", config)

    def srcs(self, ctx) -> tuple[Path, Path]:
        return ctx.asset("upstream", "TinyRecursiveModels"), ctx.asset("upstream", "adam-atan2")

    def missing(self, ctx):
        import importlib.util

        from parity.goldens.trm_pretrain import GOLDENS_EXTRA

        trm, adam = self.srcs(ctx)
        for f in (trm / "pretrain.py", adam / "adam_atan2" / "adam_atan2.py"):
            if not f.exists():
                return f"{f} (bash bench/gpu_prepare.sh --trm SRC --adam-atan2 SRC)"
        absent = [m for m in GOLDENS_EXTRA if importlib.util.find_spec(m) is None]
        if absent:
            return f"modules {', '.join(absent)} (what pretrain.py imports; .whl carries them)"
        return None

    def command(self, ctx):
        trm, adam = self.srcs(ctx)
        return _py(ctx, "-m", "bench.early_curve", f"+experiment={self.config_for(ctx)}",
                   f"data.path={ctx.work / SUDOKU_DIR}", "--trm-src", trm, "--adam-atan2-src",
                   adam, "--steps", 6 if ctx.dry_run else EARLY_CURVE_STEPS, "--device",
                   "cpu" if ctx.dry_run else "cuda")  # fmt: skip

    def result(self, ctx, rc, ended):
        for _, line in reversed(self.lines):
            if line.startswith("EARLY_CURVE {"):
                return json.loads(line[len("EARLY_CURVE ") :])
        return {}

    def headline(self, r):
        last = r["rows"][-1]
        return (f"{r['steps']} steps; lm_loss at the last: upstream {last['lm_loss'][0]:.4f}, "
                f"ours {last['lm_loss'][1]:.4f}; largest relative difference "
                f"{r['lm_loss_rel_diff_max']:.2e}; halting differs at {len(r['halting_differs_at'])} "
                f"steps")  # fmt: skip


_PROFILE_HEAD = re.compile(r"^(\S+)(?: (\w+))?: ([\d.]+) ms per step \(traced")
_PROFILE_ROW = re.compile(r"^\s*([\d.]+)\s+(\d+)\s+(\S.*)$")


HLO_TAR = "hlo.tar"


class ProfilePart(_StepPart):
    """c: `python -m bench.profile CONFIG --impl IMPL`: where one side's step spends its time,
    per XLA op (JAX, command buffers off) or per CUDA kernel (torch.profiler). The JAX step's
    optimised HLO (what each fusion computes, with the source line of each op) goes into
    OUT/hlo.tar as `<part>.hlo.gz`: one file for every profile, within what a loan brings back."""

    def __init__(self, step, config, impl):
        super().__init__(step, f"{config}_{impl}", config)
        self.impl = impl

    def hlo_file(self, ctx) -> Path:
        return ctx.work / f"{self.key}.hlo"

    def command(self, ctx):
        hlo = []
        if self.impl == "jax":
            self.hlo_file(ctx).unlink(missing_ok=True)
            hlo = ["--hlo", self.hlo_file(ctx)]
        return _py(ctx, "-m", "bench.profile", self.config_for(ctx), "--impl", self.impl,
                   "--device", self.device(ctx), "--steps", 1 if ctx.dry_run else PROFILE_STEPS,
                   "--top", 40, *self.data_args(ctx, "--data-path"), *hlo)  # fmt: skip

    def keep_hlo(self, ctx) -> str | None:
        """Append the step's HLO, gzipped, to OUT/hlo.tar; -> its member name."""
        import gzip
        import io
        import tarfile

        if self.impl != "jax" or not self.hlo_file(ctx).exists():
            return None
        data = gzip.compress(self.hlo_file(ctx).read_bytes())
        info = tarfile.TarInfo(f"{self.key}.hlo.gz")
        info.size, info.mtime = len(data), int(time.time())
        with tarfile.open(ctx.out / HLO_TAR, "a") as tar:
            tar.addfile(info, io.BytesIO(data))
        return info.name

    def result(self, ctx, rc, ended):
        out: dict = {"impl": self.impl, "rows": []}
        if hlo := self.keep_hlo(ctx):
            out["hlo"] = f"{HLO_TAR}:{hlo}"
        for _, line in self.lines:
            if m := _PROFILE_HEAD.match(line):
                out["traced_ms_per_step"] = float(m.group(3))
                out["head"] = line
            elif "head" in out and (m := _PROFILE_ROW.match(line)):
                out["rows"].append([m.group(3), float(m.group(1)), int(m.group(2))])
        if "head" not in out:  # cut before its table; the HLO, written first, is in hlo.tar
            return {k: out[k] for k in ("impl", "hlo") if "hlo" in out}
        return out

    def headline(self, r):
        if "traced_ms_per_step" not in r:
            return f"no trace; its HLO: {r['hlo']}" if "hlo" in r else ""
        top = ", ".join(f"{name[:40]} {ms:.1f}" for name, ms, _ in r.get("rows", [])[:3])
        return f"{self.impl} {r['traced_ms_per_step']:.1f} ms per step traced; top ms: {top}"


class VariantsPart(_StepPart):
    """d: `python -m bench.variants CONFIG --variant ...`: the default JAX step and each variant
    of VARIANTS, interleaved in one process on the same batch."""

    def __init__(self, step, config):
        super().__init__(step, f"{config}_variants", config)

    def out_file(self, ctx) -> Path:
        return ctx.work / f"{self.key}.json"

    def command(self, ctx):
        self.out_file(ctx).unlink(missing_ok=True)
        variants = [a for v in VARIANTS[self.config] for a in ("--variant", v)]
        return _py(ctx, "-m", "bench.variants", self.config_for(ctx), "--device",
                   self.device(ctx), "--steps", 3 if ctx.dry_run else VARIANT_STEPS, *variants,
                   *self.data_args(ctx, "--data-path"), "--out", self.out_file(ctx))  # fmt: skip

    def result(self, ctx, rc, ended):
        if not self.out_file(ctx).exists():
            return {}
        return json.loads(self.out_file(ctx).read_text())

    def headline(self, r):
        bits = []
        for row in r.get("rows", []):
            name = ",".join(f"{k}={v}" for k, v in row["overrides"].items()) or "default"
            bits.append(f"{name} {1e3 * row['step_time_s']['median']:.1f} ms "
                        f"(x{row['ratio_to_baseline']['median']:.3f})")  # fmt: skip
        return "; ".join(bits)


class FlagsPart(_StepPart):
    """d: `python -m bench.variants CONFIG --flags NAME=XLA_FLAGS ...`: each flag set of FLAG_SETS
    in its own process, base runs before and after; a set's record is kept as soon as it ends."""

    def __init__(self, step, config):
        super().__init__(step, f"{config}_flags", config)
        self.sets: list[dict] = []

    def command(self, ctx):
        flags = [a for f in FLAG_SETS[self.config] for a in ("--flags", f)]
        return _py(ctx, "-m", "bench.variants", self.config_for(ctx), "--device",
                   self.device(ctx), "--steps", 3 if ctx.dry_run else VARIANT_STEPS, *flags,
                   *self.data_args(ctx, "--data-path"))  # fmt: skip

    def watch(self, t, line):
        if line.startswith("FLAGS {"):
            self.sets.append(json.loads(line[len("FLAGS ") :]))
        return False

    def result(self, ctx, rc, ended):
        base = [r["step_time_s"]["median"] for r in self.sets
                if r["name"] == "base" and "step_time_s" in r]  # fmt: skip
        out = {"sets": self.sets, "base_ms": 1e3 * statistics.fmean(base) if base else None}
        for r in self.sets:
            if base and "step_time_s" in r:
                r["ratio_to_base"] = r["step_time_s"]["median"] / statistics.fmean(base)
        return out

    def headline(self, r):
        bits = [f"base {r['base_ms']:.1f} ms" if r.get("base_ms") else "no base run"]
        for s in r.get("sets", []):
            if s["name"] != "base":
                bits.append(f"{s['name']} x{s['ratio_to_base']:.3f}" if "ratio_to_base" in s
                            else f"{s['name']} rc {s['returncode']}")  # fmt: skip
        return "; ".join(bits)


def plan() -> list[Part]:
    """Every part, in the order they run (by priority: what answers the open questions first)."""
    return [
        EnvPart("a", "env"),
        ParityPart("a", "parity_gpt"),
        SudokuDataPart("b", "data"),
        TrainerVsBarePart("b", "trainer"),
        BenchPart("b", "trm_sudoku"),
        BenchPart("b", "gpt2_124m"),
        JaxTargetRun("e", "jax_cold"),
        NanoGPTTargetRun("e"),
        PytestPart("a", "pytest"),
        FlagsPart("d", "trm_sudoku"),
        FlagsPart("d", "gpt2_124m"),
        FlagsPart("d", "trm_sudoku_att"),
        VariantsPart("d", "gpt2_124m"),
        # measured in the second H200 session: again when the parts above are done
        ProfilePart("c", "trm_sudoku", "jax"),
        ProfilePart("c", "gpt2_124m", "jax"),
        ProfilePart("c", "trm_sudoku", "torch_compile"),
        ProfilePart("c", "gpt2_124m", "torch_compile"),
        VariantsPart("d", "trm_sudoku"),
        EarlyCurvePart("d", "trm_sudoku"),
    ]


# ----------------------------------------------------------------------------------------------
# The driver


def _utc() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class Session:
    """Runs parts one after another within their boxes, writing every record as it is made."""

    def __init__(self, ctx: Ctx, *, budget_s: float, boxes: dict, caps: dict):
        self.ctx, self.budget_s, self.boxes, self.caps = ctx, budget_s, boxes, caps
        self.t0 = time.monotonic()
        self.step_used: dict[str, float] = {}
        self.records: list[dict] = []
        ctx.out.mkdir(parents=True, exist_ok=True)
        ctx.work.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def box_for(self, part: Part) -> float:
        """The part's box (what is left of the budget when it has none), within its step's cap."""
        box = min(self.boxes.get(part.key, math.inf), self.left())
        cap = self.caps.get(part.step)
        if cap is not None:
            box = min(box, cap - self.step_used.get(part.step, 0.0))
        return box

    def write(self, record: dict) -> None:
        with open(self.ctx.out / RESULTS, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def skip_reason(self, part: Part) -> str | None:
        why = part.missing(self.ctx)
        if why:
            return f"missing {why}"
        for need in part.needs:
            rec = self.ctx.records.get(need)
            if rec is None or rec["status"] != "ok":
                return f"needs {need}, which is {rec['status'] if rec else 'not run'}"
        return None

    def run_part(self, part: Part) -> dict:
        rec = {"kind": "part", "step": part.step, "part": part.key, "started_utc": _utc()}
        reason = self.skip_reason(part)
        box = self.box_for(part)
        if reason is None and box < min(MIN_BOX_S, self.boxes.get(part.key, MIN_BOX_S)):
            reason = f"no time left ({max(box, 0):.0f} s of the step's cap or the budget)"
        if reason is not None:
            rec.update(status="skipped", reason=reason)
            return self.finish(part, rec, {})
        part.box = box
        log_path = self.ctx.out / f"{part.step}.log"
        with open(log_path, "a") as log:
            log.write(f"\n===== {part.key} (box {box:.0f} s) {_utc()}\n")
            try:
                cmd = part.command(self.ctx)
                rc, wall, ended = run_boxed(cmd, box_s=box, log=log, env=part.env(self.ctx),
                                            on_line=part.on_line)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a part that cannot start is recorded, not raised
                log.write(f"could not run: {type(e).__name__}: {e}\n")
                rec.update(status="failed", reason=f"{type(e).__name__}: {e}", box_s=round(box, 1))
                return self.finish(part, rec, {})
            log.write(f"===== {part.key}: exit {rc}, {wall:.1f} s, ended by {ended}\n")
        self.step_used[part.step] = self.step_used.get(part.step, 0.0) + wall
        if (
            ended == "stopped"
            or (ended == "exit" and rc == 0)
            or (ended == "box" and part.ok_at_box)
        ):
            status = "ok"
        else:
            status = "timeout" if ended == "box" else "failed"
        rec.update(status=status, returncode=rc, ended=ended, wall_s=round(wall, 2),
                   box_s=round(box, 1), command=shlex.join(str(c) for c in cmd),
                   log=log_path.name)  # fmt: skip
        try:
            result = part.result(self.ctx, rc, ended)
        except Exception as e:  # noqa: BLE001 - what it measured could not be read: say so
            result = {"error": f"reading the result: {type(e).__name__}: {e}"}
        return self.finish(part, rec, result)

    def finish(self, part: Part, rec: dict, result: dict) -> dict:
        rec["result"] = result
        try:
            rec["headline"] = part.headline(result) if result else ""
        except Exception:  # noqa: BLE001
            rec["headline"] = ""
        self.ctx.records[part.key] = rec
        self.records.append(rec)
        self.write(rec)
        (self.ctx.out / SUMMARY).write_text(summary_markdown(self.header, self.records))
        detail = rec.get("headline") or rec.get("reason") or ""
        wall = f"{rec['wall_s']:.0f} s" if "wall_s" in rec else "-"
        print(f"[gpu] {part.key}: {rec['status']} ({wall}) {detail}", flush=True)
        return rec

    def run(self, parts: list[Part], header: dict) -> list[dict]:
        self.header = header
        self.write(header)
        for part in parts:
            self.run_part(part)
        end = {"kind": "end", "wall_s": round(time.monotonic() - self.t0, 1),
               "status": {r["part"]: r["status"] for r in self.records}}  # fmt: skip
        self.write(end)
        return self.records


def summary_markdown(header: dict, records: list[dict]) -> str:
    env = next((r["result"] for r in records if r["part"] == "a.env" and r.get("result")), {})
    lines = [
        f"# {'Dry run (CPU)' if header.get('dry_run') else 'GPU session'}: `{header['command']}`",
        "",
        f"Started {header['started_utc']}, git {header.get('git_commit')} (tree "
        f"{(header.get('git_tree') or 'unknown')[:12]}), budget "
        f"{header['budget_s']} s. Environment: {env.get('line', 'not recorded')}",
        f"Upstream commits: {header.get('upstream_commits') or 'none in ASSETS'}",
        "",
        "| part | status | seconds (box) | result |",
        "|---|---|---|---|",
    ]
    for r in records:
        secs = f"{r['wall_s']:.0f} ({r['box_s']:.0f})" if "wall_s" in r else "-"
        detail = (r.get("headline") or r.get("reason") or "").replace("|", "/")
        lines.append(f"| {r['part']} | {r['status']} | {secs} | {detail} |")
    return "\n".join(lines) + "\n"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_tree(repo: Path = REPO) -> str | None:
    """The git tree hash of the files as they are (tracked and untracked-not-ignored), through a
    scratch index: the tree of the commit that holds exactly these files, whatever HEAD says. A
    device call copies the working tree onto a checkout of the session's first commit, so
    `git_commit` there can name an older commit than the code that ran; `git log --all
    --format='%h %T' | grep TREE` finds the one that did."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, GIT_INDEX_FILE=os.path.join(tmp, "index"))
            run = dict(cwd=repo, env=env, capture_output=True, text=True, timeout=120)
            if subprocess.run(["git", "add", "-A", "."], **run).returncode:
                return None
            out = subprocess.run(["git", "write-tree"], **run)
            return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _parse_boxes(items: list[str]) -> dict:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(
                f"bench gpu: expected NAME=SECONDS (--box e.jax_cold=60, --cap b=200), got {item!r}"
            )
        out[k] = float(v)
    return out


def select_parts(parts: list[Part], steps: list[str], keys: str | None) -> list[Part]:
    """The plan's parts of `steps`, or (`keys`) the named ones with every part they need, in plan
    order. An unknown key is an error naming the plan's keys."""
    if keys is None:
        return [part for part in parts if part.step in steps]
    by_key = {part.key: part for part in parts}
    wanted = [k for k in keys.split(",") if k]
    unknown = [k for k in wanted if k not in by_key]
    if unknown:
        raise SystemExit(f"bench gpu: --parts: unknown {', '.join(unknown)}; the plan's parts: "
                         + ", ".join(by_key))  # fmt: skip
    chosen, todo = set(), list(wanted)
    while todo:
        key = todo.pop()
        if key not in chosen:
            chosen.add(key)
            todo.extend(by_key[key].needs)
    return [part for part in parts if part.key in chosen]


def run_session(argv: list[str]) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "bench_out/gpu",
                   help="results.jsonl, summary.md, <step>.log (default: $OUT, else bench_out/gpu)")  # fmt: skip
    p.add_argument("--work", default=None, help="scratch: runs, data, bench folders (default "
                   "/tmp/bench-gpu-work, or OUT/../work in a dry run)")  # fmt: skip
    p.add_argument("--assets", default=str(REPO / ".gpu"), help="prepared inputs (default .gpu)")
    p.add_argument("--steps", default=",".join(STEPS), help="which of a,b,c,d,e (in plan order)")
    p.add_argument("--parts", default=None, metavar="KEY,KEY",
                   help="only these parts (e.g. a second call's d.trm_sudoku_variants,e.jax_cold), "
                   "with the parts they need")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=None, help="the whole plan's seconds")
    p.add_argument("--box", action="append", default=[], metavar="PART=S", help="a part's box")
    p.add_argument("--cap", action="append", default=[], metavar="STEP=S", help="a step's cap")
    p.add_argument("--dry-run", action="store_true", help="the CPU run of the same parts")
    a = p.parse_args(argv)
    steps = [s for s in a.steps.split(",") if s]
    for s in steps:
        if s not in STEPS:
            raise SystemExit(f"bench gpu: --steps: unknown step {s!r}; expected some of a,b,c,d,e")
    out = Path(a.out).resolve()
    default_work = out.parent / f"{out.name}-work" if a.dry_run else Path("/tmp/bench-gpu-work")
    ctx = Ctx(out=out, work=Path(a.work or default_work).resolve(),
              assets=Path(a.assets).resolve(), dry_run=a.dry_run)  # fmt: skip
    boxes = {**(DRY_BOXES if a.dry_run else GPU_BOXES), **_parse_boxes(a.box)}
    caps = {**(DRY_STEP_CAPS if a.dry_run else GPU_STEP_CAPS), **_parse_boxes(a.cap)}
    budget = a.budget_s or (DRY_BUDGET_S if a.dry_run else GPU_BUDGET_S)
    commits = ctx.asset("upstream", "COMMITS")
    header = {"kind": "session", "started_utc": _utc(), "dry_run": a.dry_run,
              "command": "python -m bench gpu " + shlex.join(argv), "git_commit": _git_commit(),
              "git_tree": git_tree(),
              "budget_s": budget, "steps": steps, "boxes": boxes, "step_caps": caps,
              "assets": str(ctx.assets), "work": str(ctx.work),
              "upstream_commits": "; ".join(commits.read_text().split("\n")).strip("; ")
              if commits.exists() else None}  # fmt: skip
    parts = select_parts(plan(), steps, a.parts)
    # stopped from outside: end the part in flight (run_boxed's finally) and exit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    session = Session(ctx, budget_s=budget, boxes=boxes, caps=caps)
    records = session.run(parts, header)
    print((ctx.out / SUMMARY).read_text(), flush=True)
    print(f"[gpu] wrote {ctx.out / RESULTS}, {ctx.out / SUMMARY} and the step logs", flush=True)
    return records


# ----------------------------------------------------------------------------------------------
# What parts run in their own process, and the preparation


def env_info() -> dict:
    """Device, driver and versions, each probe on its own (one that fails leaves the others)."""
    import importlib.metadata
    import platform

    from bench.machine import cpu_count, cpu_model

    info: dict = {"python": platform.python_version(), "cpu": cpu_model(), "cpu_cores": cpu_count()}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)  # fmt: skip
        info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    versions = {}
    for pkg in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax",
                "orbax-checkpoint", "grain", "hydra-core", "omegaconf", "numpy", "torch", "triton"):  # fmt: skip
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    info["versions"] = versions
    try:
        import jax

        from train.flops import peak_flops_for

        d = jax.devices()[0]
        info["jax"] = {"backend": jax.default_backend(), "devices": [str(x) for x in jax.devices()],
                       "device_kind": d.device_kind, "peak_bf16_flops": peak_flops_for(d.device_kind)}  # fmt: skip
    except Exception as e:  # noqa: BLE001
        info["jax"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        import torch

        t = {"cuda": torch.cuda.is_available(), "cuda_version": torch.version.cuda}
        if t["cuda"]:
            t["device"] = torch.cuda.get_device_name(0)
            t["cudnn"] = torch.backends.cudnn.version()
        info["torch"] = t
    except Exception as e:  # noqa: BLE001
        info["torch"] = {"error": f"{type(e).__name__}: {e}"}
    j, t = info.get("jax", {}), info.get("torch", {})
    info["line"] = (
        f"{info.get('nvidia_smi') or 'no nvidia-smi'}; jax {versions.get('jax')} "
        f"({j.get('backend')}: {j.get('device_kind')}, peak {j.get('peak_bf16_flops')}); "
        f"torch {versions.get('torch')} (CUDA {t.get('cuda_version')}, cuDNN {t.get('cudnn')}); "
        f"Python {info['python']}; {info['cpu_cores']} x {info['cpu']}"
    )
    return info


def sudoku_data(argv: list[str]) -> dict:
    """Sudoku-Extreme 1k (upstream layout, train split) x N augmentations, with a test split from
    a Sudoku-Extreme-format CSV when given: the data set of trm_sudoku, built where it is used
    (163 MB at N = 1000: too big to carry)."""
    p = argparse.ArgumentParser(prog="python -m bench gpu sudoku-data")
    p.add_argument("--src", required=True)
    p.add_argument("--test-csv")
    p.add_argument("--num-aug", type=int, default=1000)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from data.sudoku import build_sudoku
    from data.sudoku_sources import read_sudoku_csv, read_upstream_sudoku

    train = read_upstream_sudoku(a.src, "train")
    test = read_sudoku_csv(a.test_csv) if a.test_csv else None
    return build_sudoku(a.out, train, test, num_aug=a.num_aug, overwrite=True)


def prepare(argv: list[str]) -> None:
    """The data sets under ASSETS/data: our builders' outputs for the tiny and shakespeare runs,
    and the raw Sudoku-Extreme 1k and hard test set that `sudoku-data` augments on the device."""
    p = argparse.ArgumentParser(prog="python -m bench gpu prepare")
    p.add_argument(
        "--data", required=True, help="the offline data folder (tinyshakespeare/, sudoku/)"
    )
    p.add_argument("--assets", default=str(REPO / ".gpu"))
    a = p.parse_args(argv)
    src, dst = Path(a.data), Path(a.assets) / "data"
    dst.mkdir(parents=True, exist_ok=True)
    text = src / "tinyshakespeare" / "input.txt"
    if not text.exists():
        raise SystemExit(f"bench gpu prepare: {text} not found (tiny-shakespeare's input.txt)")
    from data.shakespeare_char import build

    build(dst / "shakespeare_char", input_path=text)
    for name in ("sudoku-extreme-1k-train-only", "sudoku-hard-test-1k"):
        s = src / "sudoku" / name
        if not s.is_dir():
            raise SystemExit(f"bench gpu prepare: {s} not found")
        shutil.rmtree(dst / name, ignore_errors=True)
        shutil.copytree(s, dst / name)
    tiny = dst / "sudoku-tiny-30u"
    if not (tiny / "train" / "dataset.json").exists():
        from bench import configs as bench_configs
        from bench.ttq import prepare_data

        prepare_data(bench_configs.resolve(bench_configs.get("trm_sudoku_tiny")), str(tiny), None)
    print(f"bench gpu prepare: wrote {dst}")


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "env":
        print("ENV " + json.dumps(env_info(), default=str), flush=True)
    elif argv and argv[0] == "sudoku-data":
        print("SUDOKU " + json.dumps(sudoku_data(argv[1:]), default=str), flush=True)
    elif argv and argv[0] == "prepare":
        prepare(argv[1:])
    else:
        return run_session(argv)


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
