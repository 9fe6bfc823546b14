"""Functional tests of the benchmark harness (bench/). Speed is never asserted here: these check
that a run produces a complete, well-formed record, that implementations are interleaved, and
that the tables and records hold what was measured (the FLOP counts: tests/test_flops.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import configs as bench_configs
from bench import speed
from bench.machine import gpu_names
from bench.speed import paired_ratios, summarize
from models.gpt import GPTConfig
from models.gpt.flops import gpt_flops_per_token
from models.trm import TRMConfig
from models.trm.flops import trm_flops_per_step
from tests.helpers import REPO


def _repo_env() -> dict:
    """This environment with the checkout importable from any working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


# --------------------------------------------------------------------------------------------
# Statistics


def test_summarize_quartiles_and_paired_ratios():
    s = summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (3.0, 2.0, 4.0, 1, 5, 5)
    r = paired_ratios([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert r["median"] == r["min"] == r["max"] == 0.5


# --------------------------------------------------------------------------------------------
# End to end: a 2-step run of a micro GPT through the real JAX trainer step and the torch reference

# The tiny experiments shrunk further by overrides, no data set on disk (generated batches)
_MICRO_GPT = bench_configs.BenchConfig(
    "micro_gpt", "gpt", "gpt_shakespeare_char_tiny",
    overrides=("model.block_size=8", "model.vocab_size=16", "model.n_layer=1", "model.n_head=2",
               "model.n_embd=16", "trainer.global_batch_size=2", "optim.warmup_iters=2",
               "optim.lr_decay_iters=10", "optim.max_iters=10"),
)  # fmt: skip
_MICRO_TRM = bench_configs.BenchConfig(
    "micro_trm", "trm", "trm_sudoku_tiny",
    overrides=("data.seq_len=9", "data.vocab_size=5", "model.hidden_size=8", "model.num_heads=2",
               "model.expansion=2", "model.L_cycles=1", "model.halt_max_steps=2",
               "model.puzzle_emb_ndim=8", "trainer.global_batch_size=4"),
)  # fmt: skip


def _two_step_run(config: str, out, *extra: str) -> dict:
    """Two timed steps of JAX vs torch eager, one thread each, no warm-up: a smoke run, not a timing."""
    return speed.main(
        ["--configs", config, "--impls", "jax,torch_eager", "--steps", "2", "--warmup", "0",
         "--inner", "1", "--peak-flops", "1e12", "--threads", "1", "--data", str(out / "none"),
         *extra, "--out", str(out)]
    )  # fmt: skip


@pytest.mark.slow  # two implementations' runs; the default tier checks the summary and a failing one
def test_two_step_run_writes_complete_record(tmp_path, monkeypatch):
    pytest.importorskip("torch")  # the PyTorch side of the pair (parity extra)
    monkeypatch.setitem(bench_configs.CONFIGS, "micro_gpt", _MICRO_GPT)
    result = _two_step_run("micro_gpt", tmp_path)
    on_disk = json.loads((tmp_path / speed.JSON_NAME).read_text())
    assert on_disk["results"][0]["config"] == "micro_gpt"
    for key in ("command", "machine", "peak_flops", "peak_flops_source", "loadavg_start",
                "loadavg_end", "settings", "wall_s"):  # fmt: skip
        assert key in on_disk, key
    rec = result["results"][0]
    assert rec["config_source"].startswith("configs/experiment/gpt_shakespeare_char_tiny.yaml + ")
    # round 0 (compile) + 2 timed rounds, each running A then B
    assert rec["schedule"] == ["jax", "torch_eager"] * 3
    assert rec["flops_per_step"] == gpt_flops_per_token(GPTConfig(**rec["model"])) * 8 * 2
    for impl in ("jax", "torch_eager"):
        res = rec["impls"][impl]
        assert res["status"] == "ok", res.get("traceback")
        t = res["step_time_s"]
        assert t["n"] == 2 and 0 < t["min"] <= t["q1"] <= t["median"] <= t["q3"] <= t["max"]
        assert res["items_per_s"] == pytest.approx(16 / t["median"])
        assert res["mfu"] == pytest.approx(rec["flops_per_step"] / t["median"] / 1e12)
        assert res["compile_s"] >= 0 and res["first_step_s"] > 0
        assert res["memory"]["peak_rss_bytes"] > 0
        assert len(res["losses"]) == 3 and all(x == x for x in res["losses"])
    assert rec["impls"]["jax"]["recompiles_during_timing"] == 0
    assert rec["impls"]["jax"]["info"]["step"].startswith("train.jit.jit_train_step")
    assert set(rec["ratios"]) == {"jax/torch_eager"}
    # same initial loss scale on both sides: ln(16) for a fresh model on uniform tokens
    assert abs(rec["impls"]["jax"]["losses"][0] - rec["impls"]["torch_eager"]["losses"][0]) < 0.5
    assert "| micro_gpt | jax | " in speed.speed_markdown(result)


def test_failing_impl_is_reported_not_raised(tmp_path, monkeypatch):
    # 16 is not divisible by 3: the torch side refuses the model
    bad = bench_configs.BenchConfig("bad_gpt", "gpt", "gpt_shakespeare_char_tiny",
                                    overrides=(*_MICRO_GPT.overrides, "model.n_head=3"))  # fmt: skip
    monkeypatch.setitem(bench_configs.CONFIGS, "bad_gpt", bad)
    argv = "--configs bad_gpt --impls torch_eager --steps 1 --warmup 0 --inner 1 --peak-flops 1e12"
    result = speed.main([*argv.split(), "--out", str(tmp_path)])
    res = result["results"][0]["impls"]["torch_eager"]
    assert res["status"] == "error" and "Error" in res["error"]
    assert "| bad_gpt | torch_eager | error: " in speed.speed_markdown(result)


def test_bench_configs_compose_the_trainer_experiments():
    # Every benchmark runs its composed experiment (no copy of it in bench/configs.py), with the
    # bench's own overrides on top (nanoGPT bench.py's 12-sequence GPT-2 batch).
    expected = {
        "trm_sudoku_tiny": (32, "float32"),
        "gpt_shakespeare_char_tiny": (12, "float32"),
        "trm_sudoku": (768, "bfloat16"),
        "gpt2_124m": (12, "bfloat16"),
    }
    for name, cfg in bench_configs.CONFIGS.items():
        rc = bench_configs.resolve(cfg)
        assert rc["source"].startswith(f"configs/experiment/{cfg.experiment}.yaml"), rc["source"]
        if name in expected:
            assert (rc["batch_size"], rc["dtype"]) == expected[name], name


def test_ttq_torch_side_stops_at_target(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    # The driver: same data stream, eval every K steps, stop at the first eval meeting the target.
    # The text is tests.helpers.synthetic_text (47 characters, below the model's vocab of 65).
    from bench import ttq
    from tests.helpers import synthetic_text

    (tmp_path / "input.txt").write_text(synthetic_text(), encoding="utf-8")

    micro = bench_configs.BenchConfig(
        "micro_char", "gpt", "gpt_shakespeare_char_tiny",
        overrides=tuple(o for o in _MICRO_GPT.overrides if "vocab_size" not in o),
        ttq=dict(metric="val_loss", target=100.0, eval_interval=2, eval_iters=2, max_steps=6))  # fmt: skip
    monkeypatch.setitem(bench_configs.CONFIGS, "micro_char", micro)
    paths = ["--data-dir", tmp_path / "d", "--input", tmp_path / "input.txt", "--out", tmp_path]
    result = ttq.main(["--configs", "micro_char", "--impls", "torch_eager", *map(str, paths)])
    res = result["results"][0]["impls"]["torch_eager"]
    assert res["status"] == "ok", res.get("traceback")
    # target 100 is met at the first eval (a fresh model's loss is ~ln 65 = 4.17)
    assert res["reached"] and res["steps_to_target"] == 2 and len(res["curve"]) == 1
    assert 3.5 < res["curve"][0]["val_loss"] < 5.0
    assert json.loads((tmp_path / ttq.JSON_NAME).read_text())["kind"] == "ttq"


@pytest.mark.slow
def test_trm_two_step_run_through_the_trainer_task(tmp_path, monkeypatch):
    # The TRM path: the trainer's TRMTask step (x64 loss) vs upstream's train_batch in torch.
    pytest.importorskip("torch")  # the PyTorch side of the pair (parity extra)
    monkeypatch.setitem(bench_configs.CONFIGS, "micro_trm", _MICRO_TRM)
    result = _two_step_run("micro_trm", tmp_path)
    rec = result["results"][0]
    assert rec["schedule"] == ["jax", "torch_eager"] * 3
    for impl in ("jax", "torch_eager"):
        assert rec["impls"][impl]["status"] == "ok", rec["impls"][impl].get("traceback")
    assert rec["impls"]["jax"]["info"]["step"].startswith("train.jit.jit_train_step")
    assert rec["flops_per_step"] == trm_flops_per_step(TRMConfig(**rec["model"], batch_size=4), 4)
    # both report upstream's loss per example; a fresh model on 4 labels sits near ln(5) + 0.5 BCE
    j, t = rec["impls"]["jax"]["losses"][0], rec["impls"]["torch_eager"]["losses"][0]
    assert 1.0 < j < 3.0 and 1.0 < t < 3.0 and abs(j - t) < 0.5


def test_profile_summary_counts_leaf_ops_once(tmp_path):
    """bench.profile sums leaf XLA ops; a cond's event spans its branch's ops, so it is left out
    and the branch's ops are marked as inside it (summing every event would double count)."""
    import glob

    import jax
    import jax.numpy as jnp

    from bench.profile import summarise

    @jax.jit
    def f(p, a):
        b = jnp.tanh(a @ a)  # outside the cond
        return jax.lax.cond(p, lambda x: x @ x + 1.0, lambda x: x - 1.0, b)

    a = jnp.ones((256, 256), jnp.float32)
    jax.block_until_ready(f(True, a))
    jax.profiler.start_trace(str(tmp_path))
    for _ in range(2):
        jax.block_until_ready(f(True, a))
    jax.profiler.stop_trace()
    trace = glob.glob(f"{tmp_path}/**/*.trace.json.gz", recursive=True)[0]
    leaf_ms, rows = summarise(trace, steps=2)
    names = {(name, inner) for name, _, _, inner in rows}
    assert not any(name in ("cond", "while", "call") for name, _ in names), names
    assert any(inner for _, inner in names), f"no op marked inside the cond: {names}"
    assert any(not inner for _, inner in names), f"every op marked inside the cond: {names}"
    assert leaf_ms == pytest.approx(sum(ms for _, ms, _, _ in rows))
    assert all(n >= 1 for _, _, n, _ in rows)


def test_gpu_requested_without_gpu_is_a_clear_error(tmp_path):
    from train.errors import ConfigError

    if gpu_names():
        pytest.skip("this machine has an NVIDIA GPU")
    with pytest.raises(ConfigError, match="--device gpu, but nvidia-smi lists no NVIDIA GPU"):
        speed.main(["--device", "gpu", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir()), "nothing is written before the device is checked"


@pytest.mark.parametrize(
    "argv, names",
    [
        (["bench", "--configs", "trm_sudoku_tiny,nope"], "unknown config 'nope'; known: gpt2_124m"),
        (["bench.profile", "nope"], "unknown config 'nope'; known: gpt2_124m"),
        (
            ["bench.variants", "trm_sudoku_tiny", "--variant", "nosuch=1"],
            "unknown key(s) ['nosuch']",
        ),
        (["bench", "timings", "--clone", "c", "--max-load", "-1"], "the 1-minute load average"),
        (["bench", "timings", "--clone", "c", "--parts", "tests"], "--parts tests: expected"),
        (["bench", "gpu", "--parts", "nope"], "--parts: unknown nope; the plan's parts: env,"),
        (["bench", "gpu", "--box", "env"], "--box expects KEY=SECONDS, got ['env']"),
    ],
)
def test_bench_commands_name_bad_input_in_one_line(tmp_path, argv, names):
    """An unknown bench config or model key: exit 1 and one line naming it (no traceback), before
    anything is compiled or written."""
    cmd = [sys.executable, "-m", *argv]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_repo_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert names in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not any(tmp_path.iterdir()), "nothing is written"


def test_timings_rows_from_records():
    """bench.timings: the pytest summary it reads from `make test`'s output, the cells a record
    gives (make test's install counts the base install) and the row a machine's record fills (the
    tables of them: tests/test_figures.py)."""
    from bench import timings
    from train.errors import ConfigError

    log = "....\n===== 869 passed, 3 skipped, 1 warning in 355.12s (0:05:55) =====\n"
    assert timings.pytest_summary(log) == {
        "line": "===== 869 passed, 3 skipped, 1 warning in 355.12s",
        "passed": 869,
        "seconds": 355.12,
    }

    def part(install, run, **extra):
        return {"install": {"wall_s": install}, "run": {"wall_s": run, **extra}}

    record = {"demo": part(27.7, 58.8), "test": part(95.4, 354.6, pytest={"passed": 869})}
    assert timings.cells(record) == (
        "install 28 s, then 59 s",
        "install 2m03s, then 5m55s (869 passed)",
    )
    forced = {**record, "kernels": "avx2", "cpu_isa": "AVX-512"}
    assert timings.cells(forced)[0] == "install 28 s, then 59 s (AVX2 kernels on an AVX-512 CPU)"
    assert timings.cells(None) == (timings.NOT_MEASURED,) * 2
    assert timings.row_name("AVX2", "native", 2, 0) == "avx2"
    assert timings.row_name("AVX-512", "avx2", 2, 0) == "avx2"
    assert timings.row_name("AVX-512", "native", 2, 0) == "avx512"
    assert timings.row_name("AVX2", "native", 2, 2) == "avx2-busy2"
    with pytest.raises(ConfigError, match="no table row for 4 AVX2 cores"):
        timings.row_name("AVX2", "native", 4, 0)


def test_jax_side_overrides_change_the_jax_model_only():
    """`--jax-model KEY=VALUE` (and bench.variants' `--variant`): a bare key is a model field,
    `optim.NAME` an optimiser field, each parsed and checked as the trainer's command line is; the
    torch side keeps the experiment's values."""
    from train.errors import ConfigError

    assert bench_configs.jax_override("scan=true") == "model.scan=true"
    assert bench_configs.jax_override("optim.table_update=sparse") == "optim.table_update=sparse"
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        bench_configs.jax_override("scan")
    rc = bench_configs.resolve(bench_configs.get("trm_sudoku_tiny"),
                               jax_overrides=["scan=true", "L_cycles=3", "attention_impl=xla"])  # fmt: skip
    assert (rc["jax_model"]["scan"], rc["jax_model"]["L_cycles"]) == (True, 3)
    assert rc["jax_model"]["attention_impl"] == "xla"
    assert (rc["model"]["scan"], rc["model"]["L_cycles"]) == (False, 2)


def test_a_list_override_of_key_value_items_needs_quotes():
    """docs/benchmarks.md, "A Hydra list override whose items hold `=` needs quotes"."""
    from train.compose import load_config
    from train.errors import ConfigError

    with pytest.raises(ConfigError, match="Hydra's override grammar does not read this value"):
        load_config(["+experiment=trm_sudoku_tiny", "data.build_args=[train=40,test=16]"])
    cfg = load_config(["+experiment=trm_sudoku_tiny", "data.build_args=['train=40','test=16']"])
    assert list(cfg.data.build_args) == ["train=40", "test=16"]


def test_trm_bench_batches_are_the_data_sets(tmp_path):
    """bench.runners.make_batch: with the data set on disk, the trainer's own first batch; without
    it, solved Sudoku grids with the data set's share of blanks; uniform ids only when asked for
    (docs/benchmarks.md, "A benchmark fed uniform tokens hides a contended scatter")."""
    import numpy as np

    from bench import runners
    from data.sudoku_easy import build_easy_sudoku
    from train.compose import load_config
    from train.families import make_task
    from train.mesh import make_mesh

    rc = bench_configs.resolve(bench_configs.get("trm_sudoku"))
    batch, source = runners.make_batch(rc, 0)
    assert "generated Sudoku grids" in source, source
    blank = (batch["inputs"] == 1).mean()
    assert abs(blank - runners.SUDOKU_EXTREME_BLANKS) < 0.01, blank
    digits = batch["labels"] - 1  # every label row a solved grid: each row of the grid 1..9
    assert (np.sort(digits.reshape(-1, 9, 9), axis=-1) == np.arange(1, 10)).all()
    given = batch["inputs"] != 1
    assert (batch["inputs"][given] == batch["labels"][given]).all()
    uniform, source = runners.make_batch(rc, 0, "uniform")
    assert source == "uniform tokens" and (uniform["inputs"] == 1).mean() < 0.15

    data = tmp_path / "sudoku"
    build_easy_sudoku(str(data), train=40, test=4, blanks=30, num_aug=2)
    tiny = bench_configs.resolve(bench_configs.get("trm_sudoku_tiny"), data_path=str(data))
    batch, source = runners.make_batch(tiny, 0)
    assert source.startswith(f"train split of {data}"), source
    cfg = load_config(["+experiment=trm_sudoku_tiny", f"data.path={data}", "run.seed=0",
                       "model.loss_dtype=float32"])  # fmt: skip
    first = next(make_task(cfg, make_mesh(cfg.mesh)).train_iterator())
    assert set(first) == set(batch)
    for k, v in first.items():
        np.testing.assert_array_equal(batch[k], v, err_msg=k)
