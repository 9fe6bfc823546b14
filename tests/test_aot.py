"""train.aot: HLO collective counting, memory report, and the ahead-of-time compile itself.

The counting and report logic is tested on CPU-compiled programs over the 8 fake devices of
conftest, so it is covered without libtpu; the real v4-64 compiles are `tpu_aot` (skipped when
libtpu is not importable) and run in a subprocess, because libtpu must be configured before any
backend starts (and pytest workers share /tmp/libtpu_lockfile).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from tests.helpers import REPO
from train import aot
from train.errors import ConfigError

HLO_SNIPPET = """
ENTRY %main {
  %p0 = f32[8]{0} parameter(0)
  %all-reduce.1 = f32[8]{0} all-reduce(f32[8]{0} %p0), channel_id=1, to_apply=%add
  %all-gather-start = (f32[8]{0}, f32[64]{0}) all-gather-start(f32[8]{0} %all-reduce.1), dimensions={0}
  %all-gather-done = f32[64]{0} all-gather-done((f32[8]{0}, f32[64]{0}) %all-gather-start)
  %reduce-scatter = f32[1]{0} reduce-scatter(f32[8]{0} %all-reduce.1), dimensions={0}
  %cp = f32[8]{0} collective-permute(f32[8]{0} %p0), source_target_pairs={{0,1}}
  %cps = (f32[8]{0}, f32[8]{0}) collective-permute-start(f32[8]{0} %cp), source_target_pairs={{1,0}}
  ROOT %t = (f32[8]{0}) tuple(f32[8]{0} %all-reduce.1)
}
"""


def test_count_collectives_counts_ops_not_operand_references():
    counts = aot.count_collectives(HLO_SNIPPET)
    assert counts == {
        "all-reduce": 1,  # `%all-reduce.1` as an operand three times does not count
        "all-gather": 1,  # the -start counts, the -done does not
        "reduce-scatter": 1,
        "all-to-all": 0,
        "collective-permute": 2,
    }


HLO_CONTROL_FLOW = """
%fused_computation.1 (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %cc = f32[8]{0} custom-call(f32[8]{0} %p), custom_call_target="ConcatBitcast"
}

%body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
}

ENTRY %main.2_spmd (p0: f32[8], p1: s32[]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %while.1 = (s32[], f32[8]{0}) while((s32[], f32[8]{0}) %tuple), condition=%cond, body=%body
  %conditional.3 = f32[8]{0} conditional(s32[] %p1, f32[8]{0} %p0), branch_computations={%a, %b}
  %custom-call.4 = f32[8]{0} custom-call(f32[8]{0} %p0), custom_call_target="ConcatBitcast"
  %x = f32[8]{0} custom-call(f32[8]{0} %p0), custom_call_target="X64SplitHigh"
  ROOT %fusion = f32[8]{0} fusion(f32[8]{0} %x), kind=kLoop, calls=%fused_computation.1
}
"""


def test_loops_conditionals_and_untimed_custom_calls_are_counted_in_hlo_text():
    assert aot.count_loops(HLO_CONTROL_FLOW) == 1  # `%while.1` the name does not count twice
    assert aot.count_conditionals(HLO_CONTROL_FLOW) == 1
    # the two at the top level count, the one inside the fused computation does not
    assert aot.count_entry_custom_calls(HLO_CONTROL_FLOW) == 2
    assert aot.count_x64_emulation(HLO_CONTROL_FLOW) == 1
    assert aot.entry_computation("no module") == ""


def _report(cost, *, loops=0, conditionals=0, flops_per_step=64e12, bandwidth=1e12):
    """An AOTReport around given cost figures: 32 devices of 1 PFLOP/s peak."""
    memory = aot.MemoryStats(argument=0, output=0, alias=0, temp=0, code=0, peak=0)
    return aot.AOTReport(
        name="toy",
        topology="v4-64",
        num_devices=32,
        mesh_shape={"data": 1, "fsdp": 32, "tensor": 1},
        memory=memory,
        hbm_bytes=aot.GiB,
        collectives={},
        flops_per_step=flops_per_step,
        cost=cost,
        loops=loops,
        conditionals=conditionals,
        x64_emulation_calls=0,
        peak_flops_per_device=1e15,
        hbm_bandwidth=bandwidth,
        lower_seconds=0.0,
        compile_seconds=0.0,
    )


def test_prediction_is_the_compilers_time_only_where_it_covers_the_step():
    # 2e12 FLOPs per device at 1e15/s: floor 2 ms; 4e9 bytes at 1e12 B/s: 4 ms; roofline 4 ms
    def cost(optimal, untimed=0):
        return aot.CostStats(
            flops=2e12, bytes_accessed=4e9, optimal_seconds=optimal, untimed_ops=untimed
        )

    # gpt2_124m's shape: -1 s per top-level custom call, the rest is the compiler's time
    r = _report(cost(-281.995, untimed=282))
    assert r.cost.compiler_seconds == pytest.approx(0.005)
    assert r.prediction_source == "compiler"
    assert r.predicted_step_seconds == pytest.approx(0.005)
    # analytic 64e12 over 32 devices at 1e15/s = 2 ms: MFU 2 / 5
    assert r.predicted_mfu == pytest.approx(0.4)
    assert "PREDICTED step 5 ms (compiler), MFU 40.0%" in aot.format_report(r)
    # the shape trm_sudoku's step had under a conditional: below the FLOP floor, so the roofline
    r = _report(cost(-3.9998, untimed=4))
    assert not r.compiler_time_usable and r.prediction_source == "roofline"
    assert r.predicted_step_seconds == pytest.approx(0.004)
    assert "below the FLOP floor 2 ms" in aot.format_report(r)
    # a loop or a conditional: the compiler's time never stands for the step
    for kw in ({"loops": 1}, {"conditionals": 1}):
        r = _report(cost(0.010), **kw)
        assert r.prediction_source == "roofline"
        assert "NOT used: the program has" in aot.format_report(r)
    # CPU: no optimal_seconds, no bandwidth -> no prediction at all
    r = _report(aot.CostStats(2e12, 4e9, None), bandwidth=None)
    assert r.prediction_source is None and r.predicted_mfu is None
    assert "PREDICTED" not in aot.format_report(r)
    assert "predicts" not in aot.format_summary(r)


def test_the_summary_says_the_prediction_in_words():
    """The command's default output: the predicted step and MFU, memory per chip against the
    chip's HBM; the raw terms (optimal_seconds, untimed custom calls) only under --verbose."""
    r = _report(aot.CostStats(2e12, 4e9, -281.995, untimed_ops=282))
    text = aot.format_summary(r)
    assert "  XLA's cost model predicts 5 ms per step on a v4-64 (40.0% MFU)" in text, text
    assert "optimal_seconds" not in text and "untimed" not in text
    assert "  0 MiB of 1 GiB per chip: fits" in text, text
    r = _report(aot.CostStats(2e12, 4e9, 0.010), loops=1)
    text = aot.format_summary(r)
    assert "the roofline of XLA's counts predicts 4 ms per step" in text, text
    assert (
        "(the compiler's own estimate does not cover this step: the program has 1 loop(s))" in text
    )
    assert "1 loop(s): each body counted once, so the step takes longer" in text


def test_cost_analysis_counts_a_scan_body_once_on_cpu():
    """What the report's loop caveat says: XLA's cost analysis counts a while body once. Six
    matmuls unrolled vs the same six in a lax.scan, compiled for CPU."""
    w = jnp.ones((64, 64))

    def unrolled(x):
        for _ in range(6):
            x = jnp.tanh(x @ w)
        return x

    def scanned(x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=6)[0]

    x = jnp.ones((64, 64))
    costs, loops = {}, {}
    for name, f in (("unrolled", unrolled), ("scanned", scanned)):
        compiled = jax.jit(f).lower(x).compile()
        costs[name] = aot.cost_stats(compiled).flops
        loops[name] = aot.count_loops(compiled.as_text())
    assert loops == {"unrolled": 0, "scanned": 1}
    matmul = 2 * 64**3
    assert costs["unrolled"] >= 6 * matmul
    assert matmul <= costs["scanned"] < 2 * matmul  # one body, not six


def _mesh8(axis="x"):
    return jax.make_mesh((8,), (axis,), axis_types=(AxisType.Auto,), devices=jax.devices()[:8])


def test_count_collectives_on_a_cpu_compiled_sharded_program():
    """One of each collective, written explicitly with shard_map; the counter must see each once."""
    mesh = _mesh8()

    def body(x):
        s = jax.lax.psum(x, "x")
        g = jax.lax.all_gather(x, "x", tiled=True)
        r = jax.lax.psum_scatter(g, "x", tiled=True)
        p = jax.lax.ppermute(x, "x", [(i, (i + 1) % 8) for i in range(8)])
        a = jax.lax.all_to_all(g.reshape(8, -1), "x", 0, 0, tiled=True)
        return s + r + p, a

    f = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x")), check_vma=False)
    )
    x = jnp.arange(64.0)
    compiled = f.lower(x).compile()
    assert aot.count_collectives(compiled.as_text()) == {
        "all-reduce": 1,
        "all-gather": 1,
        "reduce-scatter": 1,
        "all-to-all": 1,
        "collective-permute": 1,
    }


def test_failure_messages_say_what_they_mean():
    vmem = "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem."
    assert "not HBM" in aot._explain_failure(vmem)
    assert "device memory" in aot._explain_failure("RESOURCE_EXHAUSTED: Ran out of memory in HBM")
    assert "could not be built" in aot._explain_failure("ConfigError: model.n_layer")


def _fsdp_step_compiled():
    """A small FSDP-style SGD step: params split over 8 devices, batch split too."""
    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:8])

    def step(w, x):
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * g, jnp.mean(g)

    w = jax.ShapeDtypeStruct((256, 128), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
    jitted = jax.jit(step, out_shardings=(w.sharding, NamedSharding(mesh, P())), donate_argnums=0)
    compiled, t_lower, t_compile = aot.compile_step(jitted, (w, x), mesh)
    return compiled, mesh, t_lower, t_compile


def test_memory_report_of_a_cpu_compiled_fsdp_step():
    compiled, mesh, t_lower, t_compile = _fsdp_step_compiled()
    flops = 3 * 2 * 64 * 256 * 128  # fwd + bwd matmuls of the step, whole batch
    report = aot.analyze(
        compiled,
        name="toy",
        topology="cpu-8",
        mesh=mesh,
        flops_per_step=flops,
        hbm_bytes=aot.GiB,
        peak_flops_per_device=1e12,
        hbm_bandwidth=1e11,
        lower_seconds=t_lower,
        compile_seconds=t_compile,
    )
    m = report.memory
    # per-device shards: w is 256x128 f32 split 8 ways (16 KiB), x 64x256 split 8 ways (8 KiB)
    assert m.argument == 256 * 128 * 4 // 8 + 64 * 256 * 4 // 8
    assert m.alias == 256 * 128 * 4 // 8  # the donated w is reused for the new w
    assert m.total == m.argument + m.output - m.alias + m.temp + m.code
    # gathering the FSDP-split weight (or reducing its gradient) needs collectives
    assert sum(report.collectives.values()) > 0
    assert report.fits and report.num_devices == 8 and report.mesh_shape == {"fsdp": 8}
    assert report.step_seconds_at(1.0) == pytest.approx(flops / (8 * 1e12))
    # CPU: XLA counts FLOPs and bytes but has no optimal_seconds, so the roofline predicts
    assert report.cost.flops > 0 and report.cost.bytes_accessed > 0
    assert report.cost.optimal_seconds is None and report.prediction_source == "roofline"
    assert report.loops == 0 and report.conditionals == 0
    text = aot.format_report(report)
    for needle in ("arguments", "temporaries", "all-gather", "FLOPs per step", "FITS", "cpu-8"):
        assert needle in text
    assert "PREDICTED step" in text and "(roofline)" in text
    d = json.loads(json.dumps(report.to_json()))  # serialisable
    assert d["prediction_source"] == "roofline" and d["predicted_mfu"] == report.predicted_mfu

    small = aot.analyze(
        compiled,
        name="toy",
        topology="cpu-8",
        mesh=mesh,
        flops_per_step=flops,
        hbm_bytes=1024,
        peak_flops_per_device=1e12,
    )
    assert not small.fits
    assert "DOES NOT FIT" in aot.format_report(small)


@pytest.mark.slow  # ~10 s of CPU to compile the trainer's step; the tpu_aot test covers it too
def test_real_gpt_step_on_8_cpu_devices_through_hydra():
    """The trainer's own step (train.jit.build_train_step), composed from the repo's Hydra
    configs, FSDP on CPU."""
    from train import mesh as mesh_lib
    from train.compose import load_config
    from train.families import make_task
    from train.jit import build_train_step

    cfg = load_config(
        [
            "+experiment=gpt_shakespeare_char_tiny",
            "mesh=cpu",
            "mesh.param_sharding=fsdp",
            "trainer.global_batch_size=16",
            # smaller than the tiny experiment: this test is about the plumbing, not the model
            "model.vocab_size=65",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.block_size=16",
        ]
    )
    mesh = mesh_lib.make_mesh(cfg.mesh, devices=jax.devices()[:8])
    task = make_task(cfg, mesh, need_data=False)
    jitted, args = build_train_step(cfg, mesh, task=task)
    compiled, *_ = aot.compile_step(jitted, args, mesh)
    report = aot.analyze(
        compiled,
        name="gpt_tiny",
        topology="cpu-8",
        mesh=mesh,
        flops_per_step=task.flops_per_step,
        hbm_bytes=aot.GiB,
        peak_flops_per_device=1e12,
    )
    assert report.collectives["all-gather"] > 0  # FSDP params are gathered for the matmuls
    assert report.memory.alias > 0  # the train state is donated
    assert report.flops_per_step > 0


def _tpu_env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the TPU topology replaces the fake CPU devices
    return env


def _run_aot(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "train.aot", *args],
        cwd=REPO,
        env=_tpu_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_tpu_script(script: str, timeout: float = 600) -> dict:
    """Runs `script` (which prints one JSON line last) in a fresh process with libtpu."""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=_tpu_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


TINY_GPT = [
    "+experiment=gpt_shakespeare_char_tiny",
    "mesh=v4-64",
    "trainer.global_batch_size=32",
    "model.vocab_size=65",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=16",
]


@pytest.mark.tpu_aot
def test_aot_v4_64_tiny_gpt_reports_and_fails_when_it_does_not_fit(tmp_path):
    out = tmp_path / "r.json"
    proc = _run_aot(*TINY_GPT, "--hbm-gib=0.0001", f"--json={out}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "more than the 0.1 MiB of a v4-64 chip" in proc.stderr
    report = json.loads(out.read_text())
    assert report["topology"] == "v4-64" and report["num_devices"] == 32
    assert report["mesh_shape"] == {"data": 1, "fsdp": 32, "tensor": 1}
    assert report["fits"] is False
    # mesh=v4-64 replicates params: gradients are all-reduced, nothing is gathered
    assert report["collectives"]["all-reduce"] > 0
    assert report["collectives"]["all-gather"] == report["collectives"]["collective-permute"] == 0
    assert report["cost"]["optimal_seconds"] is not None  # XLA:TPU's own estimate is reported
    assert report["prediction_source"] in ("compiler", "roofline")
    # what it compiles, before compiling; the result in words; none of libtpu's worker noise
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(
        "train.aot: compiling gpt_shakespeare_char_tiny's train step for a v4-64 (32 devices) "
        "with XLA's TPU compiler on this CPU: minutes"
    ), proc.stdout
    assert lines[1].startswith("gpt_shakespeare_char_tiny on a v4-64 (32 devices), compiled in")
    predicted = f"{report['predicted_step_seconds'] * 1e6:.3g} us per step on a v4-64"
    assert f"  XLA's cost model predicts {predicted}" in proc.stdout, proc.stdout
    assert "DOES NOT FIT" in proc.stdout and "optimal_seconds" not in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("train.aot: gpt_shakespeare_char_tiny needs "), proc.stderr


def test_without_libtpu_the_line_names_the_tpu_extra(monkeypatch):
    """No libtpu: one line naming this project's tpu extra first (pyproject.toml has it)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a)
    )
    with pytest.raises(ConfigError) as e:
        aot.topology_devices("v4-64")
    assert str(e.value).startswith(
        "libtpu is not importable: install this project's tpu extra, pip install -e '.[tpu]'"
    )
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        assert "tpu" in tomllib.load(f)["project"]["optional-dependencies"]


@pytest.mark.tpu_aot
@pytest.mark.parametrize(  # one in the default tier, ~10 s each
    "topology",
    [
        "v5e-32",
        pytest.param("v5p-64", marks=pytest.mark.slow),
        pytest.param("v6e-32", marks=pytest.mark.slow),
    ],
)
def test_aot_compiles_for_other_32_chip_slices(tmp_path, topology):
    """This libtpu describes and compiles v5e, v5p and v6e slices too; the mesh=v4-64 config
    (32 devices) fits all three. Each reports its own chip's HBM."""
    out = tmp_path / "r.json"
    proc = _run_aot(*TINY_GPT, "--topology", topology, f"--json={out}", "--verbose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["topology"] == topology and report["num_devices"] == 32
    assert report["hbm_bytes"] == aot.TOPOLOGIES[topology].hbm_bytes
    assert report["predicted_step_seconds"] > 0
    # --verbose: the raw terms
    assert f"AOT compile of gpt_shakespeare_char_tiny for {topology}" in proc.stdout
    assert "compiler's time: optimal_seconds" in proc.stdout and "PREDICTED step" in proc.stdout


@pytest.mark.tpu_aot
def test_aot_refuses_a_float64_loss_on_a_tpu_in_one_line():
    proc = _run_aot("+experiment=trm_sudoku", "mesh=v4-64", "model.loss_dtype=float64")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()  # refused before libtpu loads: nothing else printed
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("train.aot: model.loss_dtype=float64")
    assert "set model.loss_dtype=float32" in lines[0]


@pytest.mark.tpu_aot
def test_aot_names_a_batch_the_slice_cannot_split_as_the_trainer_does():
    """trainer.global_batch_size not a multiple of the slice's batch devices: the trainer's own
    line (train.mesh.check_batch_divisible), before anything is traced, not JAX's sharding error."""
    proc = _run_aot("+experiment=trm_sudoku_tiny", "mesh=v4-64", "trainer.global_batch_size=7")
    assert proc.returncode == 1, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("train.aot: ")]
    assert ours == [
        "train.aot: trainer.global_batch_size=7 is not divisible by the 32 devices of the batch "
        "axes ['data', 'fsdp'] (mesh data=1, fsdp=32, tensor=1); use a multiple of 32 or change "
        "mesh.data / mesh.fsdp"
    ], proc.stderr[-3000:]


# What XLA:TPU's cost analysis does with a loop, a conditional and a 64-bit value, on small
# programs compiled for the v4-64 topology. One process: libtpu loads once.
# docs/tpu_runbook.md, "optimal_seconds is not a step time"
TPU_COST_FACTS = """
import json
import jax, jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from train import aot

devices = aot.topology_devices("v4-64")
mesh = jax.make_mesh((32,), ("x",), axis_types=(AxisType.Auto,), devices=devices)
rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))

def facts(f, *args):
    compiled = jax.jit(f).lower(*args).compile()
    hlo = compiled.as_text()
    cost = aot.cost_stats(compiled, hlo)
    return dict(flops=cost.flops, optimal=cost.optimal_seconds, untimed=cost.untimed_ops,
                loops=aot.count_loops(hlo), conditionals=aot.count_conditionals(hlo),
                x64=aot.count_x64_emulation(hlo))

x = jax.ShapeDtypeStruct((32 * 256, 512), jnp.float32, sharding=split)
w = jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=rep)
out = {}
def unrolled(x, w):
    for _ in range(6):
        x = jnp.tanh(x @ w)
    return x
def scanned(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=6)[0]
def mlp_update(ws, x):
    def loss(ws):
        h = x
        for v in ws:
            h = jnp.tanh(h @ v)
        return jnp.mean(h ** 2)
    return [v - 0.1 * g for v, g in zip(ws, jax.grad(loss)(ws))]
ws = [jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=rep) for _ in range(4)]
xb = jax.ShapeDtypeStruct((32 * 128, 1024), jnp.float32, sharding=split)
p = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
out["unrolled"] = facts(unrolled, x, w)
out["scanned"] = facts(scanned, x, w)
out["update"] = facts(lambda ws, x, p: mlp_update(ws, x), ws, xb, p)
out["update_in_cond"] = facts(
    lambda ws, x, p: jax.lax.cond(p > 3, lambda: list(ws), lambda: mlp_update(ws, x)), ws, xb, p)
try:  # Cloud's name for a v5e slice is v5litepod-32; libtpu's topology name is v5e:4x8
    from jax.experimental import topologies
    topologies.get_topology_desc(platform="tpu", topology_name="v5litepod:4x8",
                                 chip_config_name="default", chips_per_host_bounds=(2, 2, 1),
                                 wrap=(False, False, False))
    out["v5litepod"] = "accepted"
except Exception as e:
    out["v5litepod"] = str(e).splitlines()[0]
jax.config.update("jax_enable_x64", True)
x64 = jax.ShapeDtypeStruct((32 * 256, 512), jnp.float64, sharding=split)
out["float64"] = facts(lambda x: jnp.mean(jnp.log1p(jnp.abs(x))), x64)
print(json.dumps(out))
"""


@pytest.mark.tpu_aot
def test_tpu_cost_analysis_loops_conditionals_and_untimed_ops():
    f = _run_tpu_script(TPU_COST_FACTS)
    # a scan body counts once: six matmuls unrolled, one in the scan
    assert f["scanned"]["loops"] == 1 and f["unrolled"]["loops"] == 0
    assert f["unrolled"]["flops"] > 5 * f["scanned"]["flops"]
    # each top-level custom call counts -1 s; adding them back leaves the compiler's time
    u = f["update"]
    assert u["untimed"] > 0 and u["optimal"] < 0 < u["optimal"] + u["untimed"]
    # the same update under lax.cond: same FLOPs counted, but optimal_seconds does not cover the
    # branch (its custom calls still count -1 s each, from where the top level does not see them)
    c = f["update_in_cond"]
    assert c["conditionals"] == 1 and c["flops"] == u["flops"]
    assert c["optimal"] + c["untimed"] < 0
    # float64 is emulated: 64-bit values crossing the program's boundary are split into pairs
    assert f["float64"]["x64"] >= 2 and f["float64"]["untimed"] >= f["float64"]["x64"]
    # libtpu knows v5e as "v5e", not by Cloud's accelerator name
    assert "Invalid TPU external name" in f["v5litepod"], f["v5litepod"]


@pytest.mark.slow
@pytest.mark.tpu_aot
@pytest.mark.parametrize(
    "experiment", ["trm_sudoku", "trm_sudoku_att", "trm_maze", "trm_arc1", "gpt2_124m"]
)
def test_aot_v4_64_production_experiments_fit_with_the_plain_command(tmp_path, experiment):
    """`python -m train.aot +experiment=NAME mesh=v4-64`, no other override: the defaults are the
    recommended ones (docs/sharding.md, "Defaults on a v4-64"): params replicated, so no
    gathers, and it fits a v4 chip. No program has a loop or a conditional (TRM masks the steps
    past total_steps), so the prediction is the compiler's time for every one."""
    out = tmp_path / "r.json"
    proc = _run_aot(f"+experiment={experiment}", "mesh=v4-64", f"--json={out}", timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["fits"] and report["num_devices"] == 32
    assert report["memory"]["total"] < 32 * 2**30
    assert report["collectives"]["all-gather"] == report["collectives"]["collective-permute"] == 0
    assert report["loops"] == 0
    assert report["conditionals"] == 0
    assert report["prediction_source"] == "compiler"
    assert 0 < report["predicted_mfu"] < 1


# The float64 stablemax loss compiled for a v4-64 with the check_backend refusal skipped: the
# program XLA:TPU builds holds no 64-bit type at all (docs/sharding.md, "float64 on a TPU").
FLOAT64_PROGRAM = """
import json, re
from train import aot, mesh as mesh_lib
from train.compose import load_config
import jax
from train.families import family
from train.jit import build_train_step

devices = aot.topology_devices("v4-64")
cfg = load_config(["+experiment=trm_sudoku", "mesh=v4-64", "model.loss_dtype=float64"])
jax.config.update("jax_enable_x64", True)
mesh = mesh_lib.make_mesh(cfg.mesh, devices=devices)
task = family(cfg.family).task(cfg, mesh, need_data=False)  # make_task would refuse: check_backend
jitted, args = build_train_step(cfg, mesh, task=task)
compiled, *_ = aot.compile_step(jitted, args, mesh)
hlo = compiled.as_text()
types = sorted(set(re.findall(r"\\b([a-z]+\\d+)\\[", hlo)))
print(json.dumps(dict(types=types, total=aot.memory_stats(compiled).total)))
"""


@pytest.mark.slow
@pytest.mark.tpu_aot
def test_tpu_compiles_the_float64_loss_with_no_64_bit_type_left():
    f = _run_tpu_script(FLOAT64_PROGRAM, timeout=3000)
    assert "f32" in f["types"] and "s32" in f["types"]  # the parse finds the program's types
    assert not [t for t in f["types"] if t.endswith("64")], f["types"]
    assert f["total"] < 32 * 2**30
