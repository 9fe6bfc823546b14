"""`python -m bench gpu` (bench/gpu.py): every GPU figure of docs/benchmarks.md as one time-boxed
command.

- the mechanism, with real processes: a part that fails and a part that runs past its box are
  recorded as such (the latter killed at its box, its own child processes too), the next part
  still runs, a part whose needed part failed is skipped with the reason, a part is cut where the
  budget ends and the later ones are skipped, and every record reaches results.jsonl as it is made;
- `--parts`: the named parts with the parts they need, in plan order;
- the dry run, as a user types it (slow tier): every part of the plan on the CPU with the tiny
  configs, inputs made here (a synthetic text, a few Sudokus in the upstream layout): one record
  per part in plan order with its fields, every box respected, and given the time every part ends
  ok with what it measured (upstream's parts where the environment names the checkouts).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench import gpu
from tests.helpers import build_tiny_text, without_session_cache
from train.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _command(key: str, code: str, **kw) -> gpu.Part:
    """A part that runs a Python snippet and counts its output lines."""
    return gpu.Part(key, 60, f"-c {shlex.quote(code)}", read=lambda p, c: {"lines": len(p.lines)},
                    **kw)  # fmt: skip


def _run(tmp_path, parts, **kw) -> dict:
    ctx = gpu.Ctx(out=tmp_path / "out", work=tmp_path / "work", assets=tmp_path, dry_run=False)
    gpu.PlanRun(ctx, **kw).run(parts, {"kind": "plan", "command": "test"})
    records = [json.loads(line) for line in (ctx.out / gpu.RESULTS).read_text().splitlines()]
    assert [r["kind"] for r in records] == ["plan", *["part"] * len(parts), "end"]
    summary = (ctx.out / gpu.SUMMARY).read_text()
    assert all(f"| {p.key} |" in summary for p in parts)
    return {r["part"]: r for r in records if r["kind"] == "part"}


def test_failed_and_boxed_parts_are_recorded_and_the_next_runs(tmp_path):
    pid_file = tmp_path / "child.pid"
    sleeper = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); print('started', flush=True); "
        "time.sleep(60)"
    )
    parts = [
        _command("fails", "import sys; print('about to fail'); sys.exit(3)"),
        _command("boxed", sleeper),
        _command("after_failure", "print('still runs')", needs=("fails",)),
        _command("runs", "print('one'); print('two')"),
    ]
    t0 = time.monotonic()
    by = _run(tmp_path, parts, boxes={"boxed": 1.5}, min_box_s=1.0)
    assert time.monotonic() - t0 < 15  # the 60 s sleeper was cut at its box
    assert by["fails"]["status"] == "failed" and by["fails"]["returncode"] == 3
    boxed = by["boxed"]
    assert boxed["status"] == "timeout" and boxed["ended"] == "box" and boxed["box_s"] == 1.5
    assert 1.5 <= boxed["wall_s"] < 1.5 + 5
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
    assert by["after_failure"]["status"] == "skipped"
    assert by["after_failure"]["reason"] == "needs fails, which is failed"
    assert by["runs"]["status"] == "ok" and by["runs"]["result"] == {"lines": 2}
    log = (tmp_path / "out" / gpu.LOG).read_text()
    assert "about to fail" in log and "started" in log and "two" in log


def test_the_budget_cuts_a_part_and_skips_the_later_ones(tmp_path):
    """What does not fit is recorded, never lost: a part is cut where the budget ends (its own box
    is longer), and every later part is skipped ("no time left"), each in its record."""
    parts = [_command("runs", "print('runs')"), _command("cut", "import time; time.sleep(60)"),
             _command("late", "print('never')")]  # fmt: skip
    t0 = time.monotonic()
    by = _run(tmp_path, parts, budget_s=3.0, min_box_s=1.0)
    assert time.monotonic() - t0 < 3.0 + 5
    assert by["runs"]["status"] == "ok" and by["runs"]["result"] == {"lines": 1}
    cut = by["cut"]
    # its own box is 60 s; the budget leaves it what "runs" did not use (<= 3.0 at the record's
    # 0.1 s rounding)
    assert cut["status"] == "timeout" and cut["ended"] == "box" and cut["box_s"] <= 3.0, cut
    assert cut["wall_s"] < 3.0 + 2, cut
    assert by["late"]["status"] == "skipped" and by["late"]["reason"].startswith("no time left")


def test_parts_selects_the_named_parts_and_what_they_need():
    """`--parts`: the named parts with the parts they need, in plan order; an unknown name is one
    line naming the plan's parts."""
    keys = [
        p.key for p in gpu.select_parts(gpu.plan(), "trm_sudoku.variants,shakespeare.ours_warm")
    ]
    assert keys == [
        "sudoku_data",
        "shakespeare.ours",
        "shakespeare.ours_warm",
        "trm_sudoku.variants",
    ]
    with pytest.raises(ConfigError, match="unknown nope; the plan.s parts: env, sudoku_data, trm"):
        gpu.select_parts(gpu.plan(), "nope")


def _sudoku_inputs(assets: Path) -> None:
    """A few Sudokus in the upstream layout, made from one valid grid by the builder's own
    augmentation."""
    from data.sudoku import augment_sudoku, build_sudoku
    from data.sudoku_sources import SudokuRecords

    r, c = np.divmod(np.arange(81), 9)
    grid = ((r * 3 + r // 3 + c) % 9 + 1).astype(np.uint8)
    rng = np.random.default_rng(0)
    _, answers = augment_sudoku(grid.copy(), grid, 19, rng)
    questions = answers.copy()
    for q in questions:
        q[rng.choice(81, 30, replace=False)] = 0
    train = SudokuRecords(questions, answers, np.zeros(20), "test grids")
    build_sudoku(str(assets / gpu.SUDOKU_SRC), train, None)


def _check_measured(by: dict) -> None:
    """What each part that ended ok measured, on the CPU stand-ins."""
    res = {k: r["result"] for k, r in by.items() if r["status"] == "ok"}
    if "env" in res:
        assert res["env"]["versions"]["jax"] and res["env"]["jax"]["backend"] == "cpu"
    if "sudoku_data" in res:
        assert res["sudoku_data"]["examples"] == 20 * 3  # 2 augmentations each
    if "trm_sudoku.trainer" in res:
        r = res["trm_sudoku.trainer"]
        assert r["trainer_over_bare"] == r["trainer_s_per_step"] / r["bare_s_per_step"] > 0
        assert "sudoku-extreme-1k" in r["batch_source"] and r["schedule_steps"] > 0
    for key in ("trm_sudoku.speed", "gpt2_124m.speed"):
        if key in res:
            (result,) = res[key]["results"]
            assert result["config"] == gpu.DRY_CONFIG[key.split(".")[0]]
            assert {i: v["status"] for i, v in result["impls"].items()} == {
                "jax": "ok", "torch_eager": "ok"}  # fmt: skip
            sources = {v["info"]["batch_source"] for v in result["impls"].values()}
            assert len(sources) == 1 and ("sudoku-extreme-1k" in sources.pop()) == (key[0] == "t")
    for key in ("shakespeare.ours", "shakespeare.nanogpt", "shakespeare.ours_warm"):
        if key in res:  # stopped at its first evaluation under the target
            assert by[key]["ended"] == "stopped" and res[key]["reached"]
            values = [e["value"] for e in res[key]["evals"]]
            assert values[-1] <= gpu.DRY_TARGET_VAL_LOSS < min(values[:-1], default=99.0)
    if "pytest_gpu" in res:
        assert res["pytest_gpu"]["counts"]["skipped"] >= 2  # the gpu tests, on a CPU
    if "parity_gpt" in res:  # the CPU's bf16 report: every row passes
        assert res["parity_gpt"]["failed"] == 0 and res["parity_gpt"]["passed"] == 12
    _check_step_parts(res)


def _check_step_parts(res: dict) -> None:
    """What the flag sets, variants, profiles and upstream's pretrain.py that ended ok measured."""
    for key, r in res.items():
        config = key.split(".")[0]
        if key.endswith(".flags"):  # base, each set, base: every flag parses in this XLA
            names = [f.split("=", 1)[0] for f in gpu.FLAG_SETS[config]]
            assert [s["name"] for s in r["sets"]] == ["base", *names, "base"], r
            assert all(s["returncode"] == 0 and s["ratio_to_base"] > 0 for s in r["sets"]), r
        elif key.endswith(".variants"):  # the default, then each variant, on one batch
            assert r["config"] == gpu.DRY_CONFIG[config] and r["rows"][0]["overrides"] == {}
            assert len(r["rows"]) == 1 + len(gpu.VARIANTS[config])
        elif ".profile_" in key:  # a per-op table of the step (and the JAX step's HLO)
            assert r["traced_ms_per_step"] > 0 and len(r["rows"]) >= 3, r
            assert ("hlo" in r) == key.endswith("_jax"), r
        elif key.endswith(".upstream"):  # pretrain.py stepping on the Sudoku set, until its box
            assert r["steps_per_s"] > 0 and r["measured_steps"] >= 1, r


@pytest.mark.slow
def test_dry_run_every_part_ends_ok_given_the_time(tmp_path):
    """`python -m bench gpu --dry-run` as a user types it, boxes large enough for a busy 2-core
    machine: one record per part in plan order, each within its box, every part ok with what it
    measured, the JAX profiles' HLO in OUT/hlo/. The parts that run upstream's code run where
    TRM_GOLDENS_NANOGPT_SRC (nanoGPT's train.py), TRM_GOLDENS_TRM_SRC and
    TRM_GOLDENS_ADAM_ATAN2_SRC (pretrain.py) name checkouts, else they are skipped, naming what
    is missing."""
    pytest.importorskip("torch")  # the plan's torch parts and its GPT parity check
    assets, out = tmp_path / "assets", tmp_path / "out"
    build_tiny_text(str(assets / "data" / "shakespeare_char"))
    _sudoku_inputs(assets)
    names = {"nanoGPT": "NANOGPT", "TinyRecursiveModels": "TRM", "adam-atan2": "ADAM_ATAN2"}
    for name, var in names.items():
        if src := os.environ.get(f"TRM_GOLDENS_{var}_SRC"):
            (assets / "upstream").mkdir(exist_ok=True)
            (assets / "upstream" / name).symlink_to(src)
    env = without_session_cache()  # its cold and warm runs time the compilation cache
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("OUT", None)
    # 300 s for each part, 90 s for upstream's pretrain.py: a throughput window, ended by its box
    boxes = [f"--box={p.key}={90 if p.ok_at_box else 300}" for p in gpu.plan()]
    cmd = [sys.executable, "-m", "bench", "gpu", "--dry-run", "--out", str(out), "--assets",
           str(assets), *boxes]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    records = [json.loads(line) for line in (out / gpu.RESULTS).read_text().splitlines()]
    assert records[0]["kind"] == "plan" and records[0]["dry_run"] is True
    assert records[-1]["kind"] == "end"
    parts = [r for r in records if r["kind"] == "part"]
    assert [r["part"] for r in parts] == [p.key for p in gpu.plan()]
    by = {r["part"]: r for r in parts}
    for r in parts:
        if r["status"] == "skipped":
            assert r["part"] in ("shakespeare.nanogpt", "trm_sudoku.upstream"), r
            assert r["reason"].startswith("missing "), r  # a checkout, or what pretrain.py imports
            continue
        assert r["status"] == "ok", r
        assert {"returncode", "wall_s", "box_s", "command", "result"} <= set(r), r
        assert r["wall_s"] <= r["box_s"] + 5, r  # killed at its box, at the latest
    hlo = sorted(p.name for p in (out / "hlo").iterdir())
    assert hlo == ["gpt2_124m.profile_jax.hlo.gz", "trm_sudoku.profile_jax.hlo.gz"]
    _check_measured(by)
