"""`python -m bench gpu` (bench/gpu.py): one GPU session's plan as one time-boxed command.

- the mechanism, with real processes: a part that fails and a part that runs past its box are
  recorded as such (the latter killed at its box, its own child processes too), the next part
  still runs, a part whose input is missing or whose needed part failed is skipped with the reason,
  and every record reaches results.jsonl as it is made;
- the dry run, as a user types it: every part of the plan on the CPU with the tiny configs, inputs
  made here (a synthetic text, a few Sudokus in the upstream layout and a Sudoku-Extreme-format
  CSV): one record per part in plan order with its fields, every box and the budget respected, no
  part failed, what a part that ended ok measured, the upstream parts skipped naming what is
  missing, and OUT within what a GPU loan brings back (at most 8 files, plain names). Given the
  time, every part ends ok (the slow tier, with upstream's checkouts when the environment names
  them); what does not fit a budget or a step's cap is recorded as cut or skipped (the default
  tier, with short parts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench import gpu
from parity.compare import FLOAT32
from tests.helpers import build_tiny_text, without_session_cache

REPO = Path(__file__).resolve().parent.parent


class Command(gpu.Part):
    """A part that runs a Python snippet."""

    def __init__(self, name, code, needs=(), step="a"):
        super().__init__(step, name)
        self.code, self.needs = code, needs

    def command(self, ctx):
        return [sys.executable, "-c", self.code]

    def result(self, ctx, rc, ended):
        return {"lines": len(self.lines)}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / gpu.RESULTS).read_text().splitlines()]


def test_failed_and_boxed_parts_are_recorded_and_the_next_runs(tmp_path):
    pid_file = tmp_path / "child.pid"
    sleeper = (
        "import subprocess, sys, time; "
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); print('started', flush=True); "
        "time.sleep(60)"
    )
    parts = [
        Command("fails", "import sys; print('about to fail'); sys.exit(3)"),
        Command("boxed", sleeper),
        Command("after_failure", "print('still runs')", needs=("a.fails",)),
        Command("runs", "print('one'); print('two')"),
    ]
    ctx = gpu.Ctx(out=tmp_path / "out", work=tmp_path / "work", assets=tmp_path, dry_run=True)
    session = gpu.Session(ctx, budget_s=60, boxes={"a.boxed": 2.0}, caps={})
    t0 = time.monotonic()
    session.run(parts, {"kind": "session", "command": "test", "started_utc": "", "budget_s": 60})
    assert time.monotonic() - t0 < 20  # the 60 s sleeper was cut at its 2 s box

    recs = _records(ctx.out)
    assert [r["kind"] for r in recs] == ["session", "part", "part", "part", "part", "end"]
    by = {r["part"]: r for r in recs if r["kind"] == "part"}
    assert by["a.fails"]["status"] == "failed" and by["a.fails"]["returncode"] == 3
    boxed = by["a.boxed"]
    assert boxed["status"] == "timeout" and boxed["ended"] == "box"
    assert 2.0 <= boxed["wall_s"] < 2.0 + 5 and boxed["box_s"] == 2.0
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
    assert by["a.after_failure"]["status"] == "skipped"
    assert by["a.after_failure"]["reason"] == "needs a.fails, which is failed"
    assert by["a.runs"]["status"] == "ok" and by["a.runs"]["result"] == {"lines": 2}
    log = (ctx.out / "a.log").read_text()
    assert "about to fail" in log and "started" in log and "two" in log
    summary = (ctx.out / gpu.SUMMARY).read_text()
    assert "| a.boxed | timeout | 2 (2) |" in summary


def test_the_budget_and_a_steps_cap_cut_parts_and_the_rest_are_skipped(tmp_path):
    """What does not fit is recorded, never lost: a part with no box of its own is cut where the
    budget ends; a part past its step's cap is skipped ("no time left") while a part of another
    step still runs; once the budget is spent every later part is skipped, each in its record."""
    parts = [
        Command("first", "import time; time.sleep(60)"),  # cut by the a step's cap
        Command("capped", "print('never')"),  # a's cap is spent
        Command("b_runs", "print('runs')", step="b"),
        Command("b_cut", "import time; time.sleep(60)", step="b"),  # cut where the budget ends
        Command("late", "print('never')", step="c"),
    ]
    ctx = gpu.Ctx(out=tmp_path / "out", work=tmp_path / "work", assets=tmp_path, dry_run=True)
    session = gpu.Session(ctx, budget_s=11.5, boxes={}, caps={"a": 5.5})  # boxes >= MIN_BOX_S
    t0 = time.monotonic()
    session.run(parts, {"kind": "session", "command": "test", "started_utc": "", "budget_s": 11.5})
    assert time.monotonic() - t0 < 11.5 + 5
    by = {r["part"]: r for r in _records(ctx.out) if r["kind"] == "part"}
    assert list(by) == ["a.first", "a.capped", "b.b_runs", "b.b_cut", "c.late"]
    assert by["a.first"]["status"] == "timeout" and by["a.first"]["box_s"] == 5.5
    assert by["a.capped"]["status"] == "skipped"
    assert by["a.capped"]["reason"].startswith("no time left"), by["a.capped"]
    assert by["b.b_runs"]["status"] == "ok" and by["b.b_runs"]["result"] == {"lines": 1}
    cut = by["b.b_cut"]
    assert cut["status"] == "timeout" and cut["ended"] == "box" and cut["box_s"] <= 6, cut
    assert by["c.late"]["status"] == "skipped"
    assert by["c.late"]["reason"].startswith("no time left"), by["c.late"]
    summary = (ctx.out / gpu.SUMMARY).read_text()
    assert all(f"| {key} |" in summary for key in by)


def _sudoku_inputs(assets: Path) -> None:
    """A few Sudokus in the upstream layout (train) and as a Sudoku-Extreme CSV (test), made from
    one valid grid by the builder's own augmentation."""
    from data.sudoku import augment_sudoku, build_sudoku
    from data.sudoku_sources import SudokuRecords

    r, c = np.divmod(np.arange(81), 9)
    grid = ((r * 3 + r // 3 + c) % 9 + 1).astype(np.uint8)
    rng = np.random.default_rng(0)
    _, answers = augment_sudoku(grid.copy(), grid, 29, rng)
    questions = answers.copy()
    for q in questions:
        q[rng.choice(81, 30, replace=False)] = 0
    train = SudokuRecords(questions[:20], answers[:20], np.zeros(20), "test grids")
    build_sudoku(str(assets / "data" / "sudoku-extreme-1k-train-only"), train, None)
    csv = assets / "data" / "sudoku-hard-test-1k" / "test.csv"
    csv.parent.mkdir(parents=True)
    rows = ["source,question,answer,rating"]
    for q, a in zip(questions[20:], answers[20:]):
        cell = "".join("." if v == 0 else str(v) for v in q)
        rows.append(f"test,{cell},{''.join(map(str, a))},1")
    csv.write_text("\n".join(rows) + "\n")


def _dry_run(tmp_path, *args, upstream: dict | None = None) -> tuple[Path, list[dict], float]:
    """`python -m bench gpu --dry-run` as a user types it, on inputs made here; -> (assets, part
    records, seconds). `upstream`: {"nanoGPT" | "TinyRecursiveModels" | "adam-atan2": checkout}."""
    assets, out = tmp_path / "assets", tmp_path / "out"
    build_tiny_text(str(assets / "data" / "shakespeare_char"))
    _sudoku_inputs(assets)
    for name, src in (upstream or {}).items():
        (assets / "upstream").mkdir(exist_ok=True)
        (assets / "upstream" / name).symlink_to(src)
    env = without_session_cache()  # its cold and warm runs time the compilation cache
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("OUT", None)
    cmd = [sys.executable, "-m", "bench", "gpu", "--dry-run", "--out", str(out), "--assets",
           str(assets), *args]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    recs = _records(out)
    assert recs[0]["kind"] == "session" and recs[0]["dry_run"] is True
    assert recs[-1]["kind"] == "end"
    parts = [r for r in recs if r["kind"] == "part"]
    assert [r["part"] for r in parts] == [p.key for p in gpu.plan()]
    for r in parts:
        # On a busy machine a part may run out of its box or of the budget (recorded as such);
        # a part that fails is a bug.
        assert r["status"] in ("ok", "timeout", "skipped"), r
        if r["status"] == "skipped":
            assert r["reason"].startswith(("missing ", "no time left")), r
            continue
        assert {"returncode", "wall_s", "box_s", "command", "log", "result"} <= set(r), r
        assert r["wall_s"] <= r["box_s"] + 5, r  # killed at its box, at the latest
    # what comes back from a GPU loan: at most 8 files, plain names, nothing deeper
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files
    assert all(p.is_file() for p in out.iterdir())
    if (out / gpu.HLO_TAR).exists():  # each JAX profile's HLO, one gzipped member per part
        import gzip
        import tarfile

        with tarfile.open(out / gpu.HLO_TAR) as tar:
            members = {m.name: gzip.decompress(tar.extractfile(m).read()) for m in tar}
        kept = {r["result"]["hlo"].split(":")[1] for r in parts if r["result"].get("hlo")}
        assert set(members) == kept and all(b"HloModule" in v for v in members.values())
    summary = (out / gpu.SUMMARY).read_text()
    assert all(f"| {p.key} |" in summary for p in gpu.plan())
    return assets, parts, wall


def _check_step_part(key: str, res: dict) -> None:
    """What a c (profile) or d (variants, flags) part that ended ok measured."""
    if key.startswith("c."):  # a per-op table of the step it names (and the JAX step's HLO)
        assert key.endswith(res["impl"]) and res["traced_ms_per_step"] > 0, res
        assert len(res["rows"]) >= 3 and all(ms >= 0 for _, ms, _ in res["rows"]), res
        assert ("hlo" in res) == (res["impl"] == "jax"), res
    elif key.endswith("_variants"):  # the default, then each variant, on one batch
        config = key[2 : -len("_variants")]
        rows = res["rows"]
        assert res["config"] == gpu.DRY_CONFIG[config]
        assert [r["overrides"] for r in rows][0] == {}
        assert len(rows) == 1 + len(gpu.VARIANTS[config])
        assert all(r["step_time_s"]["median"] > 0 for r in rows)
    elif key == "d.early_curve":  # upstream's loop and ours on its batches: the same run
        assert res["steps"] == len(res["rows"]) == 6, res
        assert res["halting_differs_at"] == [], res
        # a float32 forward here (trm_sudoku_tiny); measured 5.4e-8 on an AMD AVX-512 CPU
        assert res["lm_loss_rel_diff_max"] < FLOAT32.rtol, res
    elif key.endswith("_flags"):  # base, each set, base: every flag parses in this XLA
        config = key[2 : -len("_flags")]
        names = [f.split("=", 1)[0] for f in gpu.FLAG_SETS[config]]
        assert [r["name"] for r in res["sets"]] == ["base", *names, "base"], res
        assert all(r["returncode"] == 0 and r["ratio_to_base"] > 0 for r in res["sets"]), res


def _check_measured(by: dict) -> None:
    """What each part that ended ok measured."""
    env_rec = by["a.env"]
    if env_rec["status"] == "ok":
        assert env_rec["result"]["versions"]["jax"] and env_rec["result"]["jax"]["backend"] == "cpu"
    if by["a.pytest"]["status"] == "ok":
        assert by["a.pytest"]["result"]["counts"]["skipped"] >= 2  # the gpu tests, on a CPU
        assert "tests/test_gpt_attention_impl.py" in by["a.pytest"]["result"]["files"]
    if by["a.parity_gpt"]["status"] == "ok":  # the CPU's bf16 report: every row passes
        res = by["a.parity_gpt"]["result"]
        assert res["failed"] == 0 and res["passed"] == len(res["rows"]) == 12, res
    if by["b.data"]["status"] == "ok":
        assert by["b.data"]["result"]["train"]["examples"] == 20 * 3  # 2 augmentations each
    if by["b.trainer"]["status"] == "ok":
        res = by["b.trainer"]["result"]
        assert res["trainer_s_per_step"] > 0 and res["bare_s_per_step"] > 0
        assert res["trainer_over_bare"] == res["trainer_s_per_step"] / res["bare_s_per_step"]
        assert "sudoku-extreme-1k" in res["batch_source"], res["batch_source"]
    for key, rec in by.items():
        if rec["status"] == "ok":
            _check_step_part(key, rec["result"])
    if by["b.trm_sudoku"]["status"] == "ok":
        impls = {row["impl"] for row in by["b.trm_sudoku"]["result"]["table"] if "impl" in row}
        assert impls == {"jax", "torch_eager"}
        result = by["b.trm_sudoku"]["result"]["bench"]["results"][0]
        assert result["config"] == gpu.DRY_CONFIG["trm_sudoku"]
        # fed the Sudoku set b.data built, both sides
        sources = {v["info"]["batch_source"] for v in result["impls"].values()}
        assert len(sources) == 1 and "sudoku-extreme-1k" in sources.pop(), result
    for key in ("e.jax_cold", "e.upstream"):
        if by[key]["status"] == "ok":  # stopped at its first evaluation under the target
            res = by[key]["result"]
            assert by[key]["ended"] == "stopped" and res["reached"]
            values = [e["value"] for e in res["evals"]]
            assert values[-1] <= gpu.DRY_TARGET_VAL_LOSS < min(values[:-1], default=99.0)


@pytest.mark.slow
def test_dry_run_every_part_ends_ok_given_the_time(tmp_path):
    """Boxes large enough for a busy 2-core machine: every part ends ok with what it measured.
    The parts that run upstream's code run where TRM_GOLDENS_NANOGPT_SRC (nanoGPT's train.py),
    TRM_GOLDENS_TRM_SRC and TRM_GOLDENS_ADAM_ATAN2_SRC (pretrain.py) name checkouts, else they
    are skipped, naming what is missing."""
    pytest.importorskip("torch")  # the plan's torch parts and its GPT parity check
    names = {"nanoGPT": "NANOGPT", "TinyRecursiveModels": "TRM", "adam-atan2": "ADAM_ATAN2"}
    upstream = {
        n: os.environ[f"TRM_GOLDENS_{v}_SRC"]
        for n, v in names.items()
        if os.environ.get(f"TRM_GOLDENS_{v}_SRC")
    }
    boxes = {key: 300 for key in gpu.DRY_BOXES} | {"a.env": 60, "b.data": 60}
    args = ["--budget-s", "3000", "--cap", "a=700"]
    args += [f"--box={k}={v}" for k, v in boxes.items()]
    _, parts, _ = _dry_run(tmp_path, *args, upstream=upstream)
    by = {r["part"]: r for r in parts}
    for r in parts:
        if r["part"] in ("e.upstream", "d.early_curve") and r["status"] == "skipped":
            assert len(upstream) < 3 and r["reason"].startswith("missing "), r
        else:
            assert r["status"] == "ok", r
    _check_measured(by)


def test_parts_selects_the_named_parts_and_what_they_need():
    """`--parts` (a second call's rest of the plan): the named parts with the parts they need, in
    plan order; an unknown name is one line naming the plan's parts."""
    keys = [p.key for p in gpu.select_parts(gpu.plan(), [], "d.trm_sudoku_variants,e.jax_cold")]
    assert keys == ["b.data", "e.jax_cold", "d.trm_sudoku_variants"]  # in plan order
    with pytest.raises(
        SystemExit, match="unknown d.nope; the plan.s parts: a.env, a.parity_gpt, b.data"
    ):
        gpu.select_parts(gpu.plan(), [], "d.nope")
    assert [p.key for p in gpu.select_parts(gpu.plan(), ["e"], None)] == [
        "e.jax_cold",
        "e.upstream",
    ]


def test_a_profile_cut_before_its_table_still_records_the_hlo_it_kept(tmp_path):
    """A JAX profile writes the step's HLO before it traces: one cut by its box between the two
    has put the HLO into hlo.tar, and its record names it (every member of hlo.tar is named by
    a record), with no per-op figures; a part that wrote nothing records nothing."""
    ctx = gpu.Ctx(out=tmp_path / "out", work=tmp_path / "work", assets=tmp_path, dry_run=True)
    ctx.out.mkdir()
    ctx.work.mkdir()
    part = gpu.ProfilePart("c", "gpt2_124m", "jax")
    assert part.result(ctx, -9, "box") == {}
    part.hlo_file(ctx).write_text("HloModule jit_train_step\n")
    part.on_line(1.0, "wrote the optimised HLO to ...")
    res = part.result(ctx, -9, "box")
    assert res == {"impl": "jax", "hlo": "hlo.tar:c.gpt2_124m_jax.hlo.gz"}, res
    assert part.headline(res) == "no trace; its HLO: hlo.tar:c.gpt2_124m_jax.hlo.gz"
    import tarfile

    with tarfile.open(ctx.out / gpu.HLO_TAR) as tar:
        assert tar.getnames() == ["c.gpt2_124m_jax.hlo.gz"]


def test_the_documented_plan_is_the_plan():
    """docs/benchmarks.md "What a GPU session runs": its table lists plan()'s parts in plan order,
    each with its GPU box."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    section = text[text.index("### What a GPU session runs") :]
    section = section[: section.index("\n### ", 1)] if "\n### " in section[1:] else section
    keys, boxes = [], []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"[\d, ]+", cells[0]):
            keys += re.findall(r"`([a-e]\.\w+)`", cells[1])
            boxes += [float(b) for b in cells[2].split(",")]
    assert keys == [p.key for p in gpu.plan()]
    assert boxes == [gpu.GPU_BOXES[k] for k in keys]


def test_git_tree_names_the_files_that_ran(tmp_path):
    """The session line's `git_tree` is the tree of the commit holding exactly the files there:
    HEAD's tree in a clean clone, another after an edit (the commit that has it would match), and
    HEAD's again once the edit is undone; ignored files do not count."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD^{tree}"], cwd=clone, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert gpu.git_tree(clone) == head
    readme = clone / "README.md"
    text = readme.read_text()
    readme.write_text(text + "\nan edit\n")
    assert gpu.git_tree(clone) not in (None, head)
    readme.write_text(text)
    (clone / ".gpu").mkdir(exist_ok=True)  # ignored (.gitignore): not part of the tree
    (clone / ".gpu" / "x").write_text("x")
    assert gpu.git_tree(clone) == head
