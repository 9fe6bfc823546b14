"""train.aot: HLO collective counting, memory report, and the ahead-of-time compile itself.

The counting and report logic is tested on CPU-compiled programs over the 8 fake devices of
conftest, so it is covered without libtpu; the real v4-64 compiles are `tpu_aot` (skipped when
libtpu is not importable) and run in a subprocess, because libtpu must be configured before any
backend starts (and pytest workers share /tmp/libtpu_lockfile).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from tests.helpers import REPO
from train import aot

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


def test_failure_messages_say_what_they_mean(x64):
    vmem = "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem."
    assert "not HBM" in aot._explain_failure(vmem)
    assert "optim.loss_dtype=float32" in aot._explain_failure(vmem)  # x64 is on in this test
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
    text = aot.format_report(report)
    for needle in ("arguments", "temporaries", "all-gather", "FLOPs per step", "FITS", "cpu-8"):
        assert needle in text
    json.dumps(report.to_json())  # serialisable

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


def _run_aot(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the TPU topology replaces the fake CPU devices
    return subprocess.run(
        [sys.executable, "-m", "train.aot", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.tpu_aot
def test_aot_v4_64_tiny_gpt_reports_and_fails_when_it_does_not_fit(tmp_path):
    out = tmp_path / "r.json"
    proc = _run_aot(
        "+experiment=gpt_shakespeare_char_tiny",
        "mesh=v4-64",
        "trainer.global_batch_size=32",
        "model.vocab_size=65",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.n_head=2",
        "model.block_size=16",
        "--hbm-gib=0.0001",
        f"--json={out}",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "more than the 0.1 MiB of a v4-64 chip" in proc.stderr
    report = json.loads(out.read_text())
    assert report["topology"] == "v4-64" and report["num_devices"] == 32
    assert report["mesh_shape"] == {"data": 1, "fsdp": 32, "tensor": 1}
    assert report["fits"] is False
    assert report["collectives"]["all-gather"] > 0
    assert "AOT compile of gpt_shakespeare_char_tiny for v4-64" in proc.stdout


@pytest.mark.slow
@pytest.mark.tpu_aot
@pytest.mark.parametrize(
    "overrides",
    [
        ["+experiment=trm_sudoku", "optim.loss_dtype=float32"],
        ["+experiment=gpt2_124m"],
    ],
    ids=["trm_sudoku", "gpt2_124m"],
)
def test_aot_v4_64_production_experiments_fit(tmp_path, overrides):
    out = tmp_path / "r.json"
    proc = _run_aot(*overrides, "mesh=v4-64", f"--json={out}", timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["fits"] and report["num_devices"] == 32
    assert report["memory"]["total"] < 32 * 2**30


@pytest.mark.slow
@pytest.mark.tpu_aot
def test_aot_v4_64_trm_sudoku_with_float64_loss_compiles(tmp_path):
    """Upstream's float64 stablemax turns x64 on; SignSGD's index math must stay int32 or the TPU
    compile runs out of vmem (models/trm/optim.py::_unique_int32). Measured: 1.63 GiB per device,
    docs/sharding.md."""
    proc = _run_aot("+experiment=trm_sudoku", "mesh=v4-64", timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
