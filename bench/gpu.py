"""Every GPU figure of docs/benchmarks.md in one command: `python -m bench gpu`.

    python -m bench gpu [--out DIR] [--work DIR] [--assets DIR] [--parts KEY,KEY] [--box KEY=S ...]
                        [--budget-s S] [--dry-run]
    python -m bench gpu env                 # one line: device, driver, versions

The parts of `plan()` run one after another, each a process group within its time box, so a
timeout keeps everything done before it; each record goes to OUT/results.jsonl as it is made,
OUT/summary.md is rewritten, the output goes to OUT/parts.log. The plan, its inputs (ASSETS,
`bash bench/gpu_prepare.sh`) and what comes back: docs/benchmarks.md, "Reproduce the GPU
figures". --dry-run runs the same parts on the CPU with the tiny configs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.machine import git_commit, run_streamed, utc_now
from train.errors import ConfigError, OneLineParser

REPO = Path(__file__).resolve().parent.parent
RESULTS, SUMMARY, LOG = "results.jsonl", "summary.md", "parts.log"
TARGET_VAL_LOSS = 1.47  # nanoGPT README: 1.4697 for config/train_shakespeare_char.py
SUDOKU_SRC = "data/sudoku-extreme-1k-train-only"
MIN_BOX_S = 5.0  # a part with less time than this left is skipped ("no time left")

# Step variants against the default, each a config key; XLA:GPU flag sets, each in its own
# process. log_softmax and triton_gemm are the controls of the configs' own choices
VARIANTS = {
    "gpt2_124m": ("cross_entropy_impl=log_softmax", "optim.adamw_flat=true", "attention_impl=xla"),
    "trm_sudoku": ("split_gate_up=true", "loss_dtype=float32"),
}
FLAG_SETS = {
    "gpt2_124m": ("cudnn_layer_norm=--xla_gpu_enable_cudnn_layer_norm=true",),
    "trm_sudoku": ("triton_gemm=--xla_gpu_enable_triton_gemm=true",),
    "trm_sudoku_att": ("no_triton_gemm=--xla_gpu_enable_triton_gemm=false",),
}

# The dry run: each GPU size's CPU stand-in, a target the tiny GPT reaches, short boxes
DRY_CONFIG = {"trm_sudoku": "trm_sudoku_tiny", "trm_sudoku_att": "trm_sudoku_tiny",
              "gpt2_124m": "gpt_shakespeare_char_tiny",
              "gpt_shakespeare_char": "gpt_shakespeare_char_tiny"}  # fmt: skip
DRY_TARGET_VAL_LOSS = 3.3  # gpt_shakespeare_char_tiny: 3.08 at step 20 on tiny-shakespeare
DRY_BOX_S = 30.0
DRY_SPEED = "--impls jax,torch_eager --steps 2 --warmup 0 --inner 1 --peak-flops 1e11"
DRY_OURS = "trainer.eval_interval=20 data.eval_iters=5"
# nanoGPT README's CPU recipe, shortened to the dry run's size (bench/curves.py has the full one)
DRY_NANOGPT = ("--device=cpu --compile=False --eval_iters=5 --eval_interval=20 --warmup_iters=20 "
               "--log_interval=10 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 "
               "--n_embd=128 --max_iters=300 --lr_decay_iters=300 --dropout=0.0")  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The parts


@dataclasses.dataclass
class Ctx:  # where things are, the mode, the records written so far (by key)
    out: Path
    work: Path
    assets: Path
    dry_run: bool
    records: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Part:
    """One process of the plan. `argv` runs after `python`, formatted with `fields()` and split as
    a shell splits it; so are `clean` (removed first) and `env`. What it measured: the JSON of its
    last `TAG {...}` line, or `read(part, ctx)`; `show(result)` says it in one line."""

    key: str
    box: float
    argv: str
    config: str = ""  # the bench config it runs (its CPU stand-in in a dry run)
    tag: str = ""
    read: Callable | None = None
    show: Callable = lambda r: ""
    n: tuple = (0, 0)  # steps (on a GPU, in a dry run)
    dry: str = ""  # arguments a dry run adds
    needs: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()  # under ASSETS; skipped when one is missing
    modules: tuple[str, ...] = ()  # skipped when one is not importable
    clean: tuple[str, ...] = ()
    env: dict = dataclasses.field(default_factory=dict)
    watch: Callable | None = None  # (part, t, line) -> stop here
    ok_at_box: bool = False  # a throughput window: its box is how it ends

    def __post_init__(self):
        if self.config.startswith("trm") and self.key != "sudoku_data":
            self.needs = (*self.needs, "sudoku_data")  # fed the Sudoku set it builds
        self.lines: list[str] = []
        self.state: dict = {}

    def fields(self, ctx: Ctx) -> dict:
        dry = ctx.dry_run
        return {"key": self.key, "size": DRY_CONFIG.get(self.config, self.config) if dry else
                self.config, "device": "cpu" if dry else "gpu", "cuda": "cpu" if dry else "cuda",
                "work": ctx.work, "assets": ctx.assets, "out": ctx.out, "n": self.n[dry],
                "sudoku": ctx.work / "sudoku-extreme-1k", "timeout": max(20, int(0.6 * self.box)),
                "data": ctx.work / "sudoku-extreme-1k" if "sudoku_data" in self.needs else ""}  # fmt: skip

    def command(self, ctx: Ctx) -> list[str]:
        f = self.fields(ctx)
        for path in self.clean:
            shutil.rmtree(path.format(**f), ignore_errors=True)
        argv = shlex.split(self.argv) + shlex.split(self.dry) * ctx.dry_run
        return [sys.executable, *(token.format(**f) for token in argv)]

    def environ(self, ctx: Ctx) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1", WANDB_MODE="disabled",
                   XLA_PYTHON_CLIENT_PREALLOCATE="false")  # fmt: skip
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        # docs/benchmarks.md, "A benchmark under pytest inherits the suite's 8 fake CPU devices"
        flags = env.get("XLA_FLAGS", "").split()
        env["XLA_FLAGS"] = " ".join(f for f in flags if "host_platform_device_count" not in f)
        if "sudoku_data" in self.needs:  # the TRM parts build the same default step: one cache
            env["JAX_COMPILATION_CACHE_DIR"] = str(ctx.work / "xla-cache-trm")
        if ctx.dry_run:
            env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
        return env | {k: v.format(**self.fields(ctx)) for k, v in self.env.items()}

    def on_line(self, t: float, line: str) -> bool:
        self.lines.append(line)
        return bool(self.watch and self.watch(self, t, line))

    def timed(self, t: float, line: str) -> bool:
        """A `watch` that keeps each line with its time."""
        self.state.setdefault("timed", []).append((t, line))
        return False

    def result(self, ctx: Ctx) -> dict:
        if self.read:
            return self.read(self, ctx)
        for line in reversed(self.lines):
            if self.tag and line.startswith(self.tag + " {"):
                return json.loads(line[len(self.tag) + 1 :])
        return {}


def _iqr(r: dict) -> str:
    return f"[IQR {r['q1']:.3f}-{r['q3']:.3f}]"


def json_file(name: str) -> Callable:
    """A reader of the JSON file WORK/<name> (formatted with the part's key) its command wrote."""

    def read(part: Part, ctx: Ctx) -> dict:
        path = ctx.work / name.format(key=part.key)
        return json.loads(path.read_text()) if path.exists() else {}

    return read


def show_trainer(r: dict) -> str:
    steps = r.get("schedule_steps")
    hours = f"; {steps:,} steps ~ {steps * r['trainer_s_per_step'] / 3600:.1f} h" * bool(steps)
    return (f"trainer {1e3 * r['trainer_s_per_step']:.1f} ms per step, bare "
            f"{1e3 * r['bare_s_per_step']:.1f} ms, `trainer_over_bare` "
            f"{r['trainer_over_bare']:.3f}{hours}")  # fmt: skip


def show_speed(r: dict) -> str:
    """A `python -m bench` record (bench.json): each side's median step and MFU, JAX's ratios."""
    bits = []
    for res in r["results"]:
        for impl, v in res["impls"].items():
            mfu = f" ({100 * v['mfu']:.1f}% MFU)" if v.get("mfu") else ""
            ms = v.get("step_time_s") and f"{1e3 * v['step_time_s']['median']:.1f} ms{mfu}"
            bits.append(f"{impl} {ms or v['status']}")
        bits += [f"{k} {q['median']:.3f} {_iqr(q)}" for k, q in res["ratios"].items()
                 if k.startswith("jax")]  # fmt: skip
    return "; ".join(bits)


def show_variants(r: dict) -> str:
    bits = []
    for row in r.get("rows", []):
        name = ",".join(f"{k}={v}" for k, v in row["overrides"].items()) or "default"
        q = row["ratio_to_baseline"]
        ratio = f" x{q['median']:.3f} {_iqr(q)}" if row["overrides"] else ""
        mem = f", {row['temp_bytes'] / 2**30:.1f} GiB temp" if row.get("temp_bytes") else ""
        bits.append(f"{name} {1e3 * row['step_time_s']['median']:.1f} ms{ratio}{mem}")
    return "; ".join(bits)


def read_flags(part: Part, ctx: Ctx) -> dict:
    """The `FLAGS {...}` lines of a flag sweep, each set's median over the mean of the bases."""
    sets = [json.loads(line[6:]) for line in part.lines if line.startswith("FLAGS {")]
    done = [s for s in sets if s["returncode"] == 0]
    base = [s["step_time_s"]["median"] for s in done if s["name"] == "base"]
    for s in done:
        if base:
            s["ratio_to_base"] = s["step_time_s"]["median"] / statistics.fmean(base)
    return {"sets": sets, "base_ms": 1e3 * statistics.fmean(base) if base else None}


def show_flags(r: dict) -> str:
    bits = []
    for s in r.get("sets", []):
        if "step_time_s" not in s:
            bits.append(f"{s['name']} exit {s['returncode']}")
        else:
            ratio = f", x{s['ratio_to_base']:.3f}" if s["name"] != "base" else ""
            bits.append(f"{s['name']} {1e3 * s['step_time_s']['median']:.1f} ms{ratio}")
    return "; ".join(bits)


_STEP_LINE = re.compile(r"^step (\d+): (.*)$")
_NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
_FIRST_STEP = re.compile(r"first step done ([\d.]+) s after the trainer started")


def _add_eval(part: Part, t: float, step: int, value: float) -> bool:
    """Record an evaluation (seconds since the process started); True once at the target."""
    part.state.setdefault("evals", []).append({"step": step, "value": value, "t": round(t, 2)})
    return value <= part.state["target"]


def watch_ours(part: Part, t: float, line: str) -> bool:
    """The trainer's console eval line; the exact value from metrics.jsonl, which gets the record
    before the line is printed."""
    m = _STEP_LINE.match(line)
    if not m or "eval/val_loss" not in m.group(2):
        return False
    step = int(m.group(1))
    rows = [
        json.loads(x) for x in part.state["metrics"].read_text().splitlines() if x.endswith("}")
    ]
    rows = [r for r in rows if r.get("step") == step and "eval/val_loss" in r]
    return bool(rows) and _add_eval(part, t, step, rows[-1]["eval/val_loss"])


def watch_nanogpt(part: Part, t: float, line: str) -> bool:
    m = _NANOGPT_EVAL.match(line)
    return bool(m) and _add_eval(part, t, int(m.group(1)), float(m.group(3)))


def read_target(part: Part, ctx: Ctx) -> dict:
    evals, target = part.state.get("evals", []), part.state["target"]
    hit = next((e for e in evals if e["value"] <= target), None)
    first = [float(m.group(1)) for ln in part.lines if (m := _FIRST_STEP.search(ln))]
    return {"target": target, "reached": hit is not None, "best": hit or min(
        evals, key=lambda e: e["value"], default=None), "evals": evals,
        "first_step_s": (first or [None])[0]}  # fmt: skip


def show_target(r: dict) -> str:
    b, missed = r.get("best"), f"target {r.get('target')} not reached"
    if not b:
        return missed
    return (f"val loss {b['value']:.4f} at step {b['step']}, {b['t']:.1f} s after the process "
            f"started" + f" ({missed})" * (not r["reached"]))  # fmt: skip


def gpu_test_files() -> list[str]:
    """The test files that hold gpu-marked tests (pytest -m gpu collects only from these)."""
    files = (REPO / "tests").glob("test_*.py")
    return sorted(str(p.relative_to(REPO)) for p in files if "mark.gpu" in p.read_text())


def show_pytest(r: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in r["counts"].items())


def read_pytest(part: Part, ctx: Ctx) -> dict:
    count = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")
    lines = [ln for ln in part.lines[-5:] if " in " in ln and count.search(ln)]
    counts = {k.rstrip("s"): int(n) for n, k in count.findall(lines[-1])} if lines else {}
    return {"files": gpu_test_files(), "counts": counts}


def read_parity(part: Part, ctx: Ctx) -> dict:
    """`python -m parity gpt`'s `N passed, M failed` line."""
    found = [m for ln in part.lines if (m := re.match(r"^(\d+) passed, (\d+) failed$", ln))]
    return {"passed": int(found[-1][1]), "failed": int(found[-1][2])} if found else {}


def read_profile(part: Part, ctx: Ctx) -> dict:
    """bench.profile's head line (traced ms per step) and its per-op rows; the HLO it wrote."""
    out: dict = {"impl": part.key.split(".profile_")[1], "rows": []}
    if (hlo := ctx.out / "hlo" / f"{part.key}.hlo.gz").exists():
        out["hlo"] = str(hlo.relative_to(ctx.out))
    for line in part.lines:
        if m := re.match(r"^\S+(?: \w+)?: ([\d.]+) ms per step \(traced", line):
            out.update(traced_ms_per_step=float(m.group(1)), head=line)
        elif "head" in out and (m := re.match(r"^\s*([\d.]+)\s+(\d+)\s+(\S.*)$", line)):
            out["rows"].append([m.group(3), float(m.group(1)), int(m.group(2))])
    return out


def show_profile(r: dict) -> str:
    top = ", ".join(f"`{name[:40]}` {ms:.1f}" for name, ms, _ in r.get("rows", [])[:3])
    return f"{r['traced_ms_per_step']:.1f} ms per step traced; the most ms: {top}"


_TRAIN_STEP = re.compile(r"^train step (\d+)")


def read_throughput(part: Part, ctx: Ctx) -> dict:
    """Steps per second between the second and the last `train step N` line (the first still
    carries the start-up)."""
    points = [
        (t, int(m[1])) for t, ln in part.state.get("timed", []) if (m := _TRAIN_STEP.match(ln))
    ]
    if len(points) < 3:
        return {"points": points}
    (t0, s0), (t1, s1) = points[1], points[-1]
    return {"steps_per_s": (s1 - s0) / (t1 - t0), "measured_steps": s1 - s0,
            "measured_s": round(t1 - t0, 2), "settings": "pretrain.py eager, AdamATan2 through "
            "its pure-PyTorch reference (parity/goldens/trm_pretrain.py)"}  # fmt: skip


def show_throughput(r: dict) -> str:
    return f"{r['steps_per_s']:.2f} steps per second over {r['measured_steps']} steps"


def read_sudoku(part: Part, ctx: Ctx) -> dict:
    found = [m for ln in part.lines if (m := re.search(r"train:.* ([\d,]+) examples", ln))]
    return {"examples": int(found[-1][1].replace(",", ""))} if found else {}


def plan() -> list[Part]:
    """Every part with its box in seconds on a GPU, in the order they run."""
    from parity.goldens.trm_pretrain import GOLDENS_EXTRA  # what upstream's pretrain.py imports

    trm, gpt, char = "trm_sudoku", "gpt2_124m", "gpt_shakespeare_char"
    speed = "-m bench --device {device} --configs {size} --data={data} --timeout {timeout} --out {work}/{key}"
    variants = "-m bench.variants {size} --device {device} --steps {n} --data-path={data}"
    ours = ("-m train.main +experiment={size} logging.wandb=disabled trainer.progress_bar=false "
            "run.out_dir={work}/runs run.name={key} data.path={assets}/data/shakespeare_char "
            "run.compilation_cache_dir={work}/xla-cache")  # fmt: skip
    nanogpt = ("-m bench.upstream_runs nanogpt --src {assets}/upstream/nanoGPT --seed 1337 "
               "--data {assets}/data/shakespeare_char --out {work}/nanogpt -- "
               "--out_dir={work}/nanogpt/out")  # fmt: skip
    upstream = ("-m bench.upstream_runs trm --experiment {size} --data {data} --seed 0 --device "
                "{cuda} --log-every 1 --train-only --out {work}/upstream-trm --src "
                "{assets}/upstream/TinyRecursiveModels --adam-atan2-src {assets}/upstream/adam-atan2")  # fmt: skip
    bins = "data/shakespeare_char/train.bin"
    fresh_inductor = {"TORCHINDUCTOR_CACHE_DIR": "{work}/inductor-cache",
                      "TRITON_CACHE_DIR": "{work}/inductor-cache/triton"}  # fmt: skip

    def speed_part(config, box):
        return Part(f"{config}.speed", box, speed, config, read=json_file("{key}/bench.json"),
                    show=show_speed, dry=DRY_SPEED)  # fmt: skip

    def to_target(key, box, argv, watch, **kw):
        return Part(key, box, argv, char, read=read_target, show=show_target, watch=watch, **kw)

    def flag_sets(config, box):
        sets = " ".join(f"--flags {f}" for f in FLAG_SETS[config])
        return Part(f"{config}.flags", box, f"{variants} {sets}", config, read=read_flags,
                    show=show_flags, n=(20, 3))  # fmt: skip

    def step_variants(config, box):
        tries = " ".join(f"--variant {v}" for v in VARIANTS[config])
        return Part(f"{config}.variants", box, f"{variants} {tries} --out {{work}}/{{key}}.json",
                    config, read=json_file("{key}.json"), show=show_variants, n=(20, 3))  # fmt: skip

    def profile(config, impl, box):
        hlo = " --hlo {out}/hlo/{key}.hlo.gz" * (impl == "jax")
        argv = f"-m bench.profile {{size}} --device {{device}} --steps {{n}} --top 40 --impl {impl}"
        return Part(f"{config}.profile_{impl}", box, argv + " --data-path={data}" + hlo, config,
                    read=read_profile, show=show_profile, n=(3, 1))  # fmt: skip

    return [
        Part("env", 30, "-m bench gpu env", tag="ENV", show=lambda r: r.get("line", "")),
        Part("sudoku_data", 60, f"-m data.sudoku --input-upstream {{assets}}/{SUDOKU_SRC} "
             "--num-aug {n} --output-dir {sudoku} --overwrite --no-progress", n=(1000, 2),
             inputs=(SUDOKU_SRC,), read=read_sudoku, show=lambda r: f"{r['examples']:,} examples"),
        Part("trm_sudoku.trainer", 110, "-m bench trainer +experiment={size} data.path={data} "
             "--steps {n} --warmup 2", trm, tag="TRAINER_VS_BARE", show=show_trainer, n=(12, 4)),
        speed_part(trm, 150),
        speed_part(gpt, 120),
        step_variants(gpt, 170),
        to_target("shakespeare.ours", 90, ours, watch_ours, dry=DRY_OURS, inputs=(bins,),
                  clean=("{work}/xla-cache", "{work}/runs/{key}")),
        to_target("shakespeare.nanogpt", 90, nanogpt, watch_nanogpt, dry=DRY_NANOGPT,
                  inputs=(bins, "upstream/nanoGPT/train.py"), env=fresh_inductor,
                  clean=("{work}/nanogpt", "{work}/inductor-cache")),
        to_target("shakespeare.ours_warm", 60, ours, watch_ours, dry=DRY_OURS,
                  needs=("shakespeare.ours",), clean=("{work}/runs/{key}",)),
        Part("pytest_gpu", 60, "-m pytest -m gpu -q -p no:cacheprovider " +
             " ".join(gpu_test_files()), read=read_pytest, show=show_pytest),
        Part("parity_gpt", 40, "-m parity gpt --dtype bfloat16 --device {cuda}", read=read_parity,
             show=lambda r: f"{r['passed']} passed, {r['failed']} failed"),
        flag_sets(trm, 80),
        flag_sets(gpt, 130),
        flag_sets("trm_sudoku_att", 120),
        step_variants(trm, 130),
        profile(trm, "jax", 80),
        profile(trm, "torch_compile", 120),
        profile(gpt, "jax", 60),
        profile(gpt, "torch_compile", 80),
        Part("trm_sudoku.upstream", 90, upstream, trm, read=read_throughput, show=show_throughput,
             watch=Part.timed, ok_at_box=True, clean=("{work}/upstream-trm",),
             modules=GOLDENS_EXTRA, inputs=("upstream/TinyRecursiveModels/pretrain.py",
                                                       "upstream/adam-atan2/adam_atan2")),
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The driver


class PlanRun:
    """Runs parts one after another within their boxes, writing every record as it is made."""

    def __init__(self, ctx: Ctx, *, budget_s=None, boxes=None, min_box_s: float = MIN_BOX_S):
        self.ctx, self.budget_s, self.boxes, self.min_box_s = ctx, budget_s, boxes or {}, min_box_s
        self.t0 = time.monotonic()
        self.records: list[dict] = []
        self.header: dict = {}
        ctx.out.mkdir(parents=True, exist_ok=True)
        ctx.work.mkdir(parents=True, exist_ok=True)

    def box_for(self, part: Part) -> float:
        """The part's box, within what is left of the budget."""
        box = self.boxes.get(part.key, DRY_BOX_S if self.ctx.dry_run else part.box)
        if self.budget_s is not None:
            box = min(box, self.budget_s - (time.monotonic() - self.t0))
        return box

    def write(self, record: dict) -> None:
        with open(self.ctx.out / RESULTS, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def skip_reason(self, part: Part, box: float) -> str | None:
        for path in part.inputs:
            if not (self.ctx.assets / path).exists():
                return f"missing {self.ctx.assets / path} (bash bench/gpu_prepare.sh)"
        if absent := [m for m in part.modules if importlib.util.find_spec(m) is None]:
            return f"missing modules {', '.join(absent)} (pip install -e '.[goldens]')"
        for need in part.needs:
            rec = self.ctx.records.get(need)
            if rec is None or rec["status"] != "ok":
                return f"needs {need}, which is {rec['status'] if rec else 'not run'}"
        return f"no time left ({max(box, 0):.0f} s of the budget)" if box < self.min_box_s else None

    def run_part(self, part: Part) -> dict:
        rec = {"kind": "part", "part": part.key, "started_utc": utc_now()}
        box = part.box = self.box_for(part)
        if reason := self.skip_reason(part, box):
            return self.finish(part, {**rec, "status": "skipped", "reason": reason}, {})
        part.state["target"] = DRY_TARGET_VAL_LOSS if self.ctx.dry_run else TARGET_VAL_LOSS
        part.state["metrics"] = self.ctx.work / "runs" / part.key / "metrics.jsonl"
        with open(self.ctx.out / LOG, "a") as log:
            log.write(f"\n===== {part.key} (box {box:.0f} s) {utc_now()}\n")
            try:
                cmd = part.command(self.ctx)
                rc, wall, ended = run_streamed(cmd, box_s=box, log=log, env=part.environ(self.ctx),
                                               on_line=part.on_line)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a part that cannot start is recorded, not raised
                log.write(f"could not run: {type(e).__name__}: {e}\n")
                rec.update(status="failed", reason=f"{type(e).__name__}: {e}", box_s=round(box, 1))
                return self.finish(part, rec, {})
            log.write(f"===== {part.key}: exit {rc}, {wall:.1f} s, ended by {ended}\n")
        ok = (
            ended == "stopped"
            or (ended == "exit" and rc == 0)
            or (ended == "box" and part.ok_at_box)
        )
        rec.update(status="ok" if ok else "timeout" if ended == "box" else "failed", returncode=rc,
                   ended=ended, wall_s=round(wall, 2), box_s=round(box, 1),
                   command=shlex.join(str(c) for c in cmd))  # fmt: skip
        try:
            result = part.result(self.ctx)
        except Exception as e:  # noqa: BLE001 - what it measured could not be read: say so
            result = {"error": f"reading the result: {type(e).__name__}: {e}"}
        return self.finish(part, rec, result)

    def finish(self, part: Part, rec: dict, result: dict) -> dict:
        rec["result"] = result
        try:
            rec["headline"] = part.show(result) if result else ""
        except Exception:  # noqa: BLE001 - a result without the fields its summary reads
            rec["headline"] = ""
        self.ctx.records[part.key] = rec
        self.records.append(rec)
        self.write(rec)
        (self.ctx.out / SUMMARY).write_text(summary_markdown(self.header, self.records))
        wall = f"{rec['wall_s']:.0f} s" if "wall_s" in rec else "-"
        print(f"[gpu] {part.key}: {rec['status']} ({wall}) {rec['headline'] or rec.get('reason')}",
              flush=True)  # fmt: skip
        return rec

    def run(self, parts: list[Part], header: dict) -> list[dict]:
        self.header = header
        self.write(header)
        for part in parts:
            self.run_part(part)
        self.write({"kind": "end", "wall_s": round(time.monotonic() - self.t0, 1),
                    "status": {r["part"]: r["status"] for r in self.records}})  # fmt: skip
        return self.records


def summary_markdown(header: dict, records: list[dict]) -> str:
    env = next((r["result"] for r in records if r["part"] == "env" and r.get("result")), {})
    lines = [f"# {'Dry run (CPU)' if header.get('dry_run') else 'GPU'}: `{header.get('command')}`",
             "", f"Started {header.get('started_utc')}, git {header.get('git_commit')}, budget "
             f"{header.get('budget_s') or 'none'}. Environment: {env.get('line', 'not recorded')}",
             f"Upstream commits: {header.get('upstream_commits') or 'none in ASSETS'}", "",
             "| part | status | seconds (box) | result |", "|---|---|---|---|"]  # fmt: skip
    for r in records:
        secs = f"{r['wall_s']:.0f} ({r['box_s']:.0f})" if "wall_s" in r else "-"
        detail = (r.get("headline") or r.get("reason") or "").replace("|", "/")
        lines.append(f"| {r['part']} | {r['status']} | {secs} | {detail} |")
    return "\n".join(lines) + "\n"


def select_parts(parts: list[Part], keys: str | None) -> list[Part]:
    """The plan, or (`keys`) the named parts with every part they need, in plan order. An unknown
    key is an error naming the plan's keys."""
    if keys is None:
        return parts
    by_key = {part.key: part for part in parts}
    todo = [k for k in keys.split(",") if k]
    if unknown := [k for k in todo if k not in by_key]:
        raise ConfigError(f"bench gpu: --parts: unknown {', '.join(unknown)}; the plan's parts: "
                         + ", ".join(by_key))  # fmt: skip
    chosen: set[str] = set()
    while todo:
        if (key := todo.pop()) not in chosen:
            chosen.add(key)
            todo.extend(by_key[key].needs)
    return [part for part in parts if part.key in chosen]


def run_plan(argv: list[str]) -> list[dict]:
    p = OneLineParser(prog="python -m bench gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "bench_out/gpu",
                   help="results.jsonl, summary.md, parts.log (default: $OUT, else bench_out/gpu)")  # fmt: skip
    p.add_argument("--work", default=None, help="scratch: runs, data, caches (default "
                   "/tmp/bench-gpu-work, or OUT-work in a dry run)")  # fmt: skip
    p.add_argument("--assets", default=str(REPO / ".gpu"), help="prepared inputs (default .gpu)")
    p.add_argument("--parts", default=None, metavar="KEY,KEY",
                   help="only these parts, with the parts they need")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=None, help="end the plan within S seconds")
    p.add_argument("--box", action="append", default=[], metavar="KEY=S", help="a part's box")
    p.add_argument("--dry-run", action="store_true", help="the same parts on the CPU, tiny configs")
    a = p.parse_args(argv)
    try:
        boxes = {k: float(v) for k, _, v in (b.partition("=") for b in a.box)}
    except ValueError:
        raise ConfigError(f"bench gpu: --box expects KEY=SECONDS, got {a.box}") from None
    parts = select_parts(plan(), a.parts)
    out = Path(a.out).resolve()
    work = a.work or (out.parent / f"{out.name}-work" if a.dry_run else "/tmp/bench-gpu-work")
    assets = Path(a.assets).resolve()
    ctx = Ctx(out=out, work=Path(work).resolve(), assets=assets, dry_run=a.dry_run)
    commits = assets / "upstream" / "COMMITS"
    header = {"kind": "plan", "started_utc": utc_now(), "dry_run": a.dry_run,
              "command": "python -m bench gpu " + shlex.join(argv), "git_commit": git_commit(),
              "budget_s": a.budget_s, "boxes": boxes, "assets": str(assets), "work": str(ctx.work),
              "upstream_commits": "; ".join(commits.read_text().strip().splitlines())
              if commits.exists() else None}  # fmt: skip
    # stopped from outside: end the part in flight (run_streamed's finally) and exit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    records = PlanRun(ctx, budget_s=a.budget_s, boxes=boxes).run(parts, header)
    print((ctx.out / SUMMARY).read_text(), flush=True)
    print(f"[gpu] wrote {ctx.out / RESULTS}, {ctx.out / SUMMARY} and {ctx.out / LOG}", flush=True)
    return records


def env_info() -> dict:
    """Device, driver and versions, each probe on its own (one that fails leaves the others)."""
    from bench.machine import result_header, version

    info = result_header("env", "python -m bench gpu env", "gpu")["machine"]
    if smi := shutil.which("nvidia-smi"):
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)  # fmt: skip
        info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    pkgs = "jax-cuda13-plugin jax-cuda12-plugin orbax-checkpoint grain hydra-core triton".split()
    info["versions"].update({p: v for p in pkgs if (v := version(p))})
    for name, probe in (("jax", _jax_info), ("torch", _torch_info)):
        try:
            info[name] = probe()
        except Exception as e:  # noqa: BLE001
            info[name] = {"error": f"{type(e).__name__}: {e}"}
    j, t, v = info["jax"], info["torch"], info["versions"]
    info["line"] = (f"{info.get('nvidia_smi') or 'no nvidia-smi'}; jax {v.get('jax')} "
                    f"({j.get('backend')}: {j.get('device_kind')}, peak {j.get('peak_bf16_flops')}); "
                    f"torch {v.get('torch')} (CUDA {t.get('cuda_version')}, cuDNN {t.get('cudnn')}); "
                    f"Python {info['python']}; {info['cpu_cores']} x {info['cpu']}")  # fmt: skip
    return info


def _jax_info() -> dict:
    import jax

    from train.flops import peak_flops_for

    kind = jax.devices()[0].device_kind
    return {"backend": jax.default_backend(), "devices": [str(x) for x in jax.devices()],
            "device_kind": kind, "peak_bf16_flops": peak_flops_for(kind)}  # fmt: skip


def _torch_info() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {"cuda": cuda, "cuda_version": torch.version.cuda,
            **({"device": torch.cuda.get_device_name(0), "cudnn": torch.backends.cudnn.version()}
               if cuda else {})}  # fmt: skip


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["env"]:
        print("ENV " + json.dumps(env_info(), default=str), flush=True)
        return None
    return run_plan(argv)
