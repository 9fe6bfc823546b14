"""The port and our torch reference against golden copies produced by upstream's own code
(tests/goldens/trm/, written by `python -m parity.goldens --trm-src DIR`; parity/goldens/trm.py
says what is in them and how they were made).

The fixtures hold upstream's float32 state_dict as pretrain.py saves it (`_orig_mod.` keys); the
port loads it through `parity.trm_params.from_torch`, the reference through `load_state_dict`. Then, per
ACT step of an eval rollout and of a train rollout (a new batch every step; upstream's exploration
draws replayed through parity.trm_draws) and for one gradient step:

- integer state (steps, halted, the rows each slot holds): EXACT;
- every float tensor (carry, logits, q, loss, metrics, gradients): within ENVELOPE_FACTOR times
  the float32-ulp envelope that upstream measured on itself at generation (parity/goldens/trm.py),
  never below FLOAT64.

Upstream's "float64" run (forward_dtype=float64) still computes rms_norm and RoPE in float32 and
casts q to float32; the port and the reference compute them in float64 (docs/porting_trm.md,
section "float64 runs: upcast to float32 means at least float32"). test_float64_differs_from_upstream_only_by_its_float32_casts shows that this is
the whole difference: the reference built with those three casts reproduces upstream's float64
run bit for bit on the fixtures' machine, without them it does not.

EXACT only where torch runs the kernels the manifest records (`parity.machine`: the CPU, torch and
its ATen capability, MKL's code path and mode, threads); on any other machine the same checks run
against the envelope. The same ATen capability is not the same kernels: an Intel AVX-512 CPU runs
other MKL GEMM kernels than the fixtures' AMD one (docs/porting_trm.md, "The same ATen capability
is not the same kernels"; test_kernel_identity_decides_exact_under_other_kernels).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from models.trm import TRMConfig  # noqa: E402
from parity import machine  # noqa: E402
from parity.compare import EXACT, FLOAT64, assert_close, compare  # noqa: E402
from parity.envelope import Envelope, assert_within_envelope  # noqa: E402
from parity.goldens.common import load_npz  # noqa: E402
from parity.trm_params import from_torch, to_torch  # noqa: E402

FIXTURES = Path(__file__).parent / "goldens" / "trm"
VARIANTS = ("mlp_t", "att", "learned", "hrm")
EXACT_KEYS = ("steps", "halted", "current_data.")
INPUT_KEYS = ("batch.", "explore_")
RETURN_KEYS = ("logits", "q_halt_logits", "q_continue_logits", "target_q_continue")


def _manifest() -> dict:
    return json.loads((FIXTURES / "manifest.json").read_text())["trm"]


def _same_kernels() -> bool:
    """Whether torch here gives the bits of the machine that generated the fixtures."""
    return machine.same_kernels(_manifest().get("machine"))


def port_config(variant: str, dtype: str) -> TRMConfig:
    """The port's TRMConfig for the fixture's upstream config dict."""
    up = _manifest()["variants"][variant]["config"][dtype]
    cfg = {k: v for k, v in up.items() if k != "causal"}
    if variant == "hrm":
        cfg["arch"] = "hrm"
    # "xla" is float32 inside (docs/porting_trm.md, "jax.nn.dot_product_attention is float32 inside")
    cfg["attention_impl"] = "explicit"
    return TRMConfig(**cfg)


def golden(variant: str, dtype: str) -> dict:
    return load_npz(FIXTURES / f"trm_{variant}_{dtype}.npz")


def golden_steps(arrays: dict, mode: str) -> list[tuple[dict, dict, dict]]:
    """The fixture's rollout: per step (exact, floats, inputs) with inputs = the step's batch and
    (train) upstream's exploration draws."""
    steps, i = [], 0
    while f"{mode}.{i}.steps" in arrays:
        pre = f"{mode}.{i}."
        names = {k[len(pre) :]: v for k, v in arrays.items() if k.startswith(pre)}
        steps.append(
            (
                {k: v for k, v in names.items() if k.startswith(EXACT_KEYS)},
                {k: v for k, v in names.items() if not k.startswith(EXACT_KEYS + INPUT_KEYS)},
                {k: v for k, v in names.items() if k.startswith(INPUT_KEYS)},
            )
        )
        i += 1
    return steps


def _batch(inputs: dict, to) -> dict:
    return {k[len("batch.") :]: to(v) for k, v in inputs.items() if k.startswith("batch.")}


def _record(carry, outputs, loss, metrics, np_of) -> tuple[dict, dict]:
    exact = {"steps": carry.steps, "halted": carry.halted}
    exact.update({f"current_data.{k}": v for k, v in carry.current_data.items()})
    floats = dict(carry.inner_carry, **outputs, loss=loss)
    floats.update({f"metrics.{k}": v for k, v in metrics.items()})
    return {k: np_of(v) for k, v in exact.items()}, {k: np_of(v) for k, v in floats.items()}


# ----------------------------------------------------------------------------- the port


def load_port(variant: str, dtype: str):
    """The port holding upstream's checkpoint; float64: every float variable in float64 (the
    values are float32-exact), as upstream's `.double()` at generation."""
    sd = load_npz(FIXTURES / f"trm_{variant}_state_dict.npz")
    model = from_torch(sd, port_config(variant, dtype))
    if dtype == "float64":
        for _, var in nnx.iter_graph(model):
            if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState):
                value = var.get_value()
                if jnp.issubdtype(value.dtype, jnp.floating):
                    var.set_value(jnp.asarray(value, jnp.float64))
    return model


def port_rollout(model, steps, *, train: bool) -> list[tuple[dict, dict]]:
    """The port through the fixture's steps, one jitted ACT step + loss head per step."""
    from parity.trm_draws import with_draws
    from parity.trm_fixtures import jitted_act_step

    model.train() if train else model.eval()
    model = with_draws(model)  # upstream's draws replayed
    jstep = jitted_act_step()
    carry = model.initial_carry(_batch(steps[0][2], jnp.asarray))
    out = []
    for _, _, inputs in steps:
        expl = (inputs["explore_u"], inputs["explore_k"]) if train else None
        carry, *rest = jstep(model, carry, _batch(inputs, jnp.asarray), expl)
        out.append(_record(carry, *rest, np.asarray))
    return out


def envelope_of(arrays: dict, mode: str) -> Envelope:
    return Envelope([{"upstream": float(e)} for e in arrays[f"{mode}.envelope"]])


def _check_rollout(variant: str, dtype: str, mode: str):
    arrays = golden(variant, dtype)
    steps = golden_steps(arrays, mode)
    port = port_rollout(load_port(variant, dtype), steps, train=mode == "train")
    assert_within_envelope(port, [s[:2] for s in steps], envelope_of(arrays, mode))
    return np.stack([ex["halted"] for ex, _ in port])


DEFAULT_ROLLOUTS = {
    ("att", "float64", "train"),
    ("mlp_t", "float32", "eval"),
    ("hrm", "float64", "train"),  # target_q_continue and q_continue_loss
    ("learned", "float32", "eval"),  # the largest ratio to the envelope measured (1.75)
}
ROLLOUTS = [
    pytest.param(v, d, m, marks=() if (v, d, m) in DEFAULT_ROLLOUTS else pytest.mark.slow)
    for v in VARIANTS
    for d in ("float64", "float32")
    for m in ("train", "eval")
]


@pytest.mark.parametrize("variant,dtype,mode", ROLLOUTS)
def test_port_rollout_matches_upstream(variant, dtype, mode, x64):
    halted = _check_rollout(variant, dtype, mode)
    if mode == "eval":  # eval ignores the q head: every row runs halt_max_steps
        assert not halted[:-1].any() and halted[-1].all()


def test_golden_train_rollouts_exercise_halting_and_refill():
    """What the train fixtures cover: the q head and exploration halt rows at different steps
    (att, mlp_t, hrm) and halted slots are refilled from the next batch."""
    for variant in ("att", "mlp_t", "hrm"):
        steps = golden_steps(golden(variant, "float64"), "train")
        halted = np.stack([ex["halted"] for ex, _, _ in steps])
        counts = np.stack([ex["steps"] for ex, _, _ in steps])
        assert halted[:-1].any() and len(set(counts[halted].tolist())) > 1, (variant, counts)
        draws = np.stack([inp["explore_u"] for _, _, inp in steps])
        assert (draws < 0.5).any() and (draws >= 0.5).any()  # some rows explore, some do not


def port_grads(variant: str, dtype: str):
    from parity.trm_fixtures import jax_grads

    arrays = golden(variant, dtype)
    batch = {k[len("grad.batch.") :]: v for k, v in arrays.items() if k.startswith("grad.batch.")}
    loss, grads = jax_grads(
        load_port(variant, dtype), batch, (arrays["grad.explore_u"], arrays["grad.explore_k"])
    )
    return arrays, loss, grads


GRADS = [
    pytest.param(v, d, marks=() if (v, d) == ("att", "float64") else pytest.mark.slow)
    for v, d in [(v, "float64") for v in VARIANTS] + [("mlp_t", "float32"), ("att", "float32")]
]


@pytest.mark.parametrize("variant,dtype", GRADS)
def test_port_gradients_match_upstream(variant, dtype, x64):
    """Every parameter's gradient and the puzzle rows' (`local_weights.grad`) for one train step."""
    arrays, loss, grads = port_grads(variant, dtype)
    tol = envelope_of(arrays, "grad").tolerance(0, "gradients")
    assert_close("loss", loss, arrays["grad.loss"], tol)
    expected = {
        k[len("grad._orig_mod.") :]: v for k, v in arrays.items() if k.startswith("grad._orig_mod.")
    }
    expected["puzzle_rows"] = arrays["grad.puzzle_rows"]
    assert set(grads) == set(expected), sorted(set(grads) ^ set(expected))
    for k, v in expected.items():
        assert_close(k, grads[k], v, tol)


def test_upstream_checkpoint_round_trips_through_the_port():
    """from_torch reads pretrain.py's checkpoint (`_orig_mod.` keys) and to_torch(compiled=True)
    writes back exactly its keys, shapes, dtypes and bits."""
    for variant in VARIANTS:
        sd = load_npz(FIXTURES / f"trm_{variant}_state_dict.npz")
        assert all(k.startswith("_orig_mod.model.inner.") for k in sd)
        back = to_torch(load_port(variant, "float32"), compiled=True)
        assert set(back) == set(sd)
        for k, v in sd.items():
            assert back[k].numpy().dtype == v.dtype, k
            assert_close(k, back[k].numpy(), v, EXACT)


# ------------------------------------------------------------------------ our reference


def load_reference(variant: str, dtype: str):
    from parity.trm_torch import ACTLossHead, build_model

    sd = load_npz(FIXTURES / f"trm_{variant}_state_dict.npz")
    head = ACTLossHead(build_model(port_config(variant, dtype)))
    head.load_state_dict({k.removeprefix("_orig_mod."): torch.from_numpy(v) for k, v in sd.items()})
    if dtype == "float64":  # as upstream at generation: .double(), a fresh float64 grad leaf
        head.double()
        pe = head.model.inner.puzzle_emb
        pe.local_weights = torch.zeros(
            pe.local_weights.shape, dtype=torch.float64, requires_grad=True
        )
    return head


class upstream_float32_casts:
    """Build and run our reference with upstream's roundings in a float64 run: rms_norm and RoPE
    in float32 (instead of "at least float32"), q logits cast to float32."""

    def __enter__(self):
        import parity.trm_torch.layers as layers
        import parity.trm_torch.modeling as models

        self.saved = layers.compute_dtype, models.InnerBase.heads
        heads = self.saved[1]

        def float32_heads(self, z):
            logits, (q_halt, q_continue) = heads(self, z)
            return logits, (q_halt.float(), q_continue.float())

        layers.compute_dtype = lambda dtype: torch.float32
        models.InnerBase.heads = float32_heads

    def __exit__(self, *exc):
        import parity.trm_torch.layers as layers
        import parity.trm_torch.modeling as models

        layers.compute_dtype, models.InnerBase.heads = self.saved


def reference_rollout(head, steps, *, train: bool) -> list[tuple[dict, dict]]:
    head.train(train)
    carry = head.initial_carry(_batch(steps[0][2], torch.from_numpy))
    out = []
    for _, _, inputs in steps:
        expl = None
        if train:
            expl = (torch.from_numpy(inputs["explore_u"]), torch.from_numpy(inputs["explore_k"]))
        with torch.no_grad():
            carry, loss, metrics, outputs, _ = head(
                carry=carry,
                batch=_batch(inputs, torch.from_numpy),
                exploration=expl,
                return_keys=RETURN_KEYS,
            )
        out.append(_record(carry, outputs, loss, metrics, lambda t: t.detach().numpy()))
    return out


def _max_scale_rel(actual, steps) -> float:
    return max(
        compare(k, fl_a[k], v, FLOAT64).scale_rel
        for (_, fl_a), (_, fl, _) in zip(actual, steps, strict=True)
        for k, v in fl.items()
    )


def reference_vs_upstream(variant: str, dtype: str, mode: str):
    """Our reference through the fixture's rollout (float64: with upstream's three float32 casts):
    (our steps, upstream's steps, upstream's envelope)."""
    arrays = golden(variant, dtype)
    steps = golden_steps(arrays, mode)
    with upstream_float32_casts() if dtype == "float64" else _nothing():
        ref = reference_rollout(load_reference(variant, dtype), steps, train=mode == "train")
    return ref, [s[:2] for s in steps], envelope_of(arrays, mode)


def _reference_matches(variant, dtype, mode) -> None:
    """Reference vs upstream: EXACT on every tensor where torch runs the generating machine's
    kernels, and within the envelope everywhere."""
    ref, expected, envelope = reference_vs_upstream(variant, dtype, mode)
    if _same_kernels():
        for (ex_r, fl_r), (ex, fl) in zip(ref, expected, strict=True):
            for k, v in {**ex, **fl}.items():
                assert_close(k, {**ex_r, **fl_r}[k], v, EXACT)
    assert_within_envelope(ref, expected, envelope)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reference_reproduces_upstream_rollouts(variant, dtype):
    """parity/trm_torch is upstream: float32 as it is, float64 with upstream's three float32
    casts; train and eval rollouts. Measured bit-identical on the fixtures' machine (AMD EPYC,
    ATen avx512, MKL's generic path); not on an Intel AVX-512 CPU (MKL's AVX-512 GEMM kernels:
    1.1e-5 on float32's z_H, 1-2 ulp on float64's logits), which the envelope judges."""
    for mode in ("train", "eval"):
        _reference_matches(variant, dtype, mode)


@pytest.mark.parametrize("variant", VARIANTS)
def test_float64_differs_from_upstream_only_by_its_float32_casts(variant):
    """The deliberate deviation, pinned: our "at least float32" float64 run differs from upstream's
    float64 run (which rounds rms_norm/RoPE/q to float32) by float32-sized amounts already at
    step 1, and by nothing else: with the casts it is the same run (previous test)."""
    arrays = golden(variant, "float64")
    steps = golden_steps(arrays, "eval")
    plain = reference_rollout(load_reference(variant, "float64"), steps[:1], train=False)
    diff = _max_scale_rel(plain, steps[:1])
    assert 1e-9 < diff < 1e-5, diff  # float32 round-off (~6e-8 per op), not float64's ~1e-16
    assert_within_envelope(plain, [s[:2] for s in steps[:1]], envelope_of(arrays, "eval"))


def reference_gradients(variant: str):
    """Our reference's float64 loss and gradients (with upstream's casts) beside upstream's:
    [(name, ours, upstream's)], and the bound of upstream's gradient envelope."""
    from parity.trm_fixtures import torch_grads

    arrays = golden(variant, "float64")
    batch = {k[len("grad.batch.") :]: v for k, v in arrays.items() if k.startswith("grad.batch.")}
    with upstream_float32_casts():
        head = load_reference(variant, "float64")
        loss, grads = torch_grads(head, batch, (arrays["grad.explore_u"], arrays["grad.explore_k"]))
    assert len(grads) == sum(k.startswith(("grad._orig_mod.", "grad.puzzle_rows")) for k in arrays)
    pairs = [("loss", loss, arrays["grad.loss"])]
    for k, v in grads.items():
        name = "grad.puzzle_rows" if k == "puzzle_rows" else f"grad._orig_mod.{k}"
        pairs.append((k, v.numpy(), arrays[name]))
    return pairs, envelope_of(arrays, "grad").tolerance(0, "gradients")


@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_gradients_reproduce_upstream(variant):
    pairs, bound = reference_gradients(variant)
    tol = EXACT if _same_kernels() else bound
    for name, ours, upstream in pairs:
        assert_close(name, ours, upstream, tol)


# ----------------------------------------------------- which machines give the fixtures' bits


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


# Kernel settings this CPU can run, each in a process of its own: ATen's capabilities, MKL's
# instruction sets and MKL's reproducibility modes (the bits each gives on the fixtures' machine:
# docs/porting_trm.md, "The same ATen capability is not the same kernels"). ATen runs the kernels
# ATEN_CPU_CAPABILITY names without asking the CPU: avx512 on a CPU without it dies of SIGILL
# (docs/porting_trm.md, "ATEN_CPU_CAPABILITY=avx512 is not checked").
KERNEL_SETTINGS = (
    [{}]
    + [
        {"ATEN_CPU_CAPABILITY": c}
        for c in ("default", "avx2") + (("avx512",) if _cpu_has_avx512() else ())
    ]
    + [{"MKL_ENABLE_INSTRUCTIONS": i} for i in ("SSE4_2", "AVX2", "AVX512")]
    + [{"MKL_CBWR": m} for m in ("COMPATIBLE", "AVX2", "AVX512")]
)

# the att float32 rollouts and float64 gradients, EXACT and against the envelope; what
# parity.machine decides for this process; one JSON line
_REFERENCE_ON_THESE_KERNELS = """
import json
import torch
torch.set_num_threads(1)  # as the test session (tests/conftest.py)
from parity import machine
from parity.compare import EXACT, compare
from parity.envelope import check_within_envelope
import tests.test_goldens_trm as t

identical, within = True, True
for mode in ("train", "eval"):
    ref, expected, envelope = t.reference_vs_upstream("att", "float32", mode)
    for (ex_r, fl_r), (ex, fl) in zip(ref, expected, strict=True):
        got = {**ex_r, **fl_r}
        identical &= all(compare(k, got[k], v, EXACT).passed for k, v in {**ex, **fl}.items())
    rows = check_within_envelope(ref, expected, envelope)
    within &= all(c.passed for row in rows for c in row)
pairs, bound = t.reference_gradients("att")
identical &= all(compare(k, a, b, EXACT).passed for k, a, b in pairs)
within &= all(compare(k, a, b, bound).passed for k, a, b in pairs)
here = machine.identity()
print(json.dumps({
    "difference": machine.difference(t._manifest().get("machine")),
    "identical": identical,
    "within": within,
    "kernels": [here["aten_cpu_capability"], here["mkl_code_path"], here["mkl_cnr"]],
}))
"""


@pytest.mark.slow
def test_kernel_identity_decides_exact_under_other_kernels():
    """Under each of KERNEL_SETTINGS, in its own process: wherever parity.machine says "the
    fixtures' kernels" the reference is bit-identical to upstream's fixtures (att float32 train and
    eval rollouts, att float64 gradients), and everywhere it is within upstream's envelope. Some
    settings change the bits (on the fixtures' machine: ATen's avx2 and default kernels, every
    MKL_CBWR mode), so a helper that ignored them would fail here."""
    repo = Path(__file__).parent.parent
    base = {k: v for k, v in os.environ.items() if k not in machine.KNOBS + ("MKL_VERBOSE",)}
    results = {}
    for setting in KERNEL_SETTINGS:
        env = dict(base, PYTHONPATH=str(repo), **setting)
        cmd = [sys.executable, "-c", _REFERENCE_ON_THESE_KERNELS]
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results[" ".join(f"{k}={v}" for k, v in setting.items()) or "(none)"] = json.loads(
            proc.stdout.strip().splitlines()[-1]
        )
    table = "\n".join(f"{name}: {r}" for name, r in results.items())
    for name, r in results.items():
        assert r["within"], f"{name} leaves the envelope\n{table}"
        assert r["difference"] or r["identical"], f"{name}: same kernels, other bits\n{table}"
    assert not all(r["identical"] for r in results.values()), f"no setting moved a bit\n{table}"


# ------------------------------------------------------------------------- regeneration


@pytest.mark.slow
def test_regenerating_reproduces_the_committed_fixtures(tmp_path):
    """TRM_GOLDENS_TRM_SRC=<checkout of SamsungSAILMontreal/TinyRecursiveModels at the manifest's
    commit>: regenerate into a temporary directory; every array must equal the committed one
    (EXACT on the machine the manifest records, parity.machine; elsewhere skipped)."""
    src = os.environ.get("TRM_GOLDENS_TRM_SRC")
    if not src:
        pytest.skip("set TRM_GOLDENS_TRM_SRC to a TinyRecursiveModels checkout")
    from parity.goldens import trm

    section = trm.generate(Path(src), tmp_path)
    committed = _manifest()
    assert section["commit"] == committed["commit"], "check out the manifest's upstream commit"
    why = machine.difference(committed.get("machine"))
    if why:
        pytest.skip(f"not the fixtures' kernels ({why}): the floats would differ by round-off")
    files = sorted(p.name for p in FIXTURES.glob("trm_*.npz"))
    assert files == sorted(p.name for p in tmp_path.glob("trm_*.npz"))
    for name in files:
        new, old = load_npz(tmp_path / name), load_npz(FIXTURES / name)
        assert set(new) == set(old), name
        for k, v in old.items():
            assert_close(f"{name}:{k}", new[k], v, EXACT)


# ------------------------------------------------------------------------------ data side


def test_arc_evaluator_matches_upstream(tmp_path):
    """data.arc_eval.ARCEvaluator on the batches upstream's evaluators/arc.py scored: the same
    pass@K for every K (exactly), and the same submission.json except, on purpose, a test input
    no row predicted: upstream drops it (shifting that task's later attempts), we keep its slot
    with [[0]] (data/arc_eval.py)."""
    from data.arc_eval import ARCEvaluator

    meta = json.loads((FIXTURES / "trm_arc_eval.json").read_text())
    arrays = load_npz(FIXTURES / "trm_arc_eval.npz")
    (tmp_path / "identifiers.json").write_text(json.dumps(meta["identifiers"]))
    (tmp_path / "test_puzzles.json").write_text(json.dumps(meta["test_puzzles"]))
    ev = ARCEvaluator(tmp_path, submission_K=meta["submission_K"], pass_Ks=meta["pass_Ks"])
    ev.begin_eval()
    for i in range(meta["batches"]):
        b = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"batch{i}.")}
        ev.update_batch(
            {"inputs": b["inputs"], "puzzle_identifiers": b["puzzle_identifiers"]},
            {"preds": b["preds"], "q_halt_logits": b["q_halt_logits"]},
        )
    metrics = ev.result(tmp_path / "out")
    assert metrics == meta["metrics"]
    assert metrics["ARC/pass@1"] < metrics["ARC/pass@2"]  # the vote decides something
    ours = json.loads((tmp_path / "out" / "submission.json").read_text())
    upstream = meta["submission"]
    assert set(ours) == set(upstream)
    for task, entries in upstream.items():
        if entries:
            assert ours[task] == entries, task
        else:  # the task whose only test input got no prediction
            n_test = len(meta["test_puzzles"][task]["test"])
            assert ours[task] == [{"attempt_1": [[0]], "attempt_2": [[0]]}] * n_test, task


def _dataset_dir(tmp_path) -> tuple[Path, dict, dict]:
    from parity.goldens.trm_data import write_dataset_files

    meta = json.loads((FIXTURES / "trm_puzzle_dataset.json").read_text())
    arrays = load_npz(FIXTURES / "trm_puzzle_dataset.npz")
    files = {k[len("file.") :]: v for k, v in arrays.items() if k.startswith("file.")}
    return write_dataset_files(tmp_path, files, meta["files"]), meta, arrays


def _upstream_batches(arrays: dict, prefix: str) -> list[dict]:
    n = int(arrays[f"{prefix}.batches"])
    keys = ("inputs", "labels", "puzzle_identifiers")
    return [{k: arrays[f"{prefix}.{i}.{k}"] for k in keys} for i in range(n)]


def test_puzzle_test_batches_match_upstream(tmp_path):
    """data.puzzle_source.PuzzleTestDataset on the data set our builder wrote (files in the
    fixture): the test batches upstream's PuzzleDataset yielded, EXACT, for one process and for
    each of two (local rows, padding with pad_id / -100 / the blank id)."""
    from data.puzzle_source import PuzzleTestDataset

    root, meta, arrays = _dataset_dir(tmp_path)
    for prefix, index, count in (("test", 0, 1), ("test_rank0of2", 0, 2), ("test_rank1of2", 1, 2)):
        ds = PuzzleTestDataset(
            str(root),
            global_batch_size=meta["global_batch_size"],
            process_index=index,
            process_count=count,
        )
        expected = _upstream_batches(arrays, prefix)
        assert len(ds) == len(expected), prefix
        for i, exp in enumerate(expected):
            got = ds[i]
            for k, v in exp.items():
                assert got[k].dtype == v.dtype, (prefix, i, k)
                assert_close(f"{prefix} batch {i} {k}", got[k], v, EXACT)
            # upstream's effective size = real rows of the global batch; ours marks them in mask
            eff = int(arrays[f"{prefix}.{i}.effective"])
            assert int(got["mask"].sum()) == max(
                0, min(eff - index * len(got["mask"]), len(got["mask"]))
            )


def test_puzzle_train_batches_follow_upstreams_sampling(tmp_path):
    """Train batches: upstream draws its example order from the unseeded global numpy RNG, so the
    port's seeded plan cannot give the same rows (on purpose, data/puzzle_source.py). What must
    agree, and does: the number of batches per iteration, shapes and dtypes, every row is a stored
    example with its own puzzle's identifier and upstream's label mapping (0 -> -100), and each
    group is drawn epochs_per_iter times per iteration."""
    from data.puzzle_format import load_split
    from data.puzzle_source import PuzzleTrainDataset

    root, meta, arrays = _dataset_dir(tmp_path)
    expected = _upstream_batches(arrays, "train")
    ds = PuzzleTrainDataset(
        str(root),
        global_batch_size=meta["global_batch_size"],
        seed=0,
        epochs_per_iter=meta["epochs_per_iter"],
        num_iterations=1,
        process_index=0,
        process_count=1,
    )
    ours = list(ds)
    assert len(ours) == len(expected)
    a = load_split(str(root), "train").all  # int32, labels mapped 0 -> -100 like upstream
    store_in, store_lab = np.asarray(a.inputs), np.asarray(a.labels)
    puzzle_of_example = np.searchsorted(a.puzzle_indices, np.arange(len(store_in)), "right") - 1
    group_of_example = np.searchsorted(a.group_indices, puzzle_of_example, "right") - 1

    def groups_drawn(batches):
        drawn = []
        for b in batches:
            for x, y in zip(b["inputs"], b["labels"], strict=True):
                hit = np.flatnonzero((store_in == x).all(1) & (store_lab == y).all(1))
                assert hit.size, "a batch row is not a stored example"
                drawn.append(int(group_of_example[hit[0]]))
        return sorted(drawn)

    for theirs, mine in zip(expected, ours, strict=True):
        for k, v in theirs.items():
            assert mine[k].shape == v.shape and mine[k].dtype == v.dtype, k
    n_groups = len(np.asarray(a.group_indices)) - 1
    assert (
        groups_drawn(expected)
        == groups_drawn(ours)
        == sorted(list(range(n_groups)) * meta["epochs_per_iter"])
    )


def test_golden_bound_catches_a_wrong_port(x64):
    """The bound is narrow enough to matter: the port with one weight element moved by 1e-3
    (L_level.layers.1.mlp.down_proj.weight[0, 0]; those weights have std 1/16) leaves the envelope at
    step 1 of the att float64 eval rollout."""
    from parity.envelope import check_within_envelope

    arrays = golden("att", "float64")
    steps = golden_steps(arrays, "eval")[:1]
    model = load_port("att", "float64")
    w = model.inner.L_level.layers[1].mlp.down_proj.weight
    w[...] = w[...].at[0, 0].add(1e-3)
    port = port_rollout(model, steps, train=False)
    rows = check_within_envelope(port, [s[:2] for s in steps], envelope_of(arrays, "eval"))
    failed = [c.name for c in rows[0] if not c.passed]
    assert "step 1 z_H" in failed and "step 1 logits" in failed, failed


def test_upstream_bugs_we_fix_are_real():
    """The three upstream failures docs/porting_trm.md lists ("Upstream bugs, fixed") as upstream's
    own code raised them at generation (manifest `upstream_bugs`). Our reference and the port run
    these paths: test_trm_loss.py::test_loss_head_matches_torch (softmax),
    test_trm_rollout.py::test_rollout_trm_no_act_continue_train_float64,
    test_trm_forward_parity.py::test_no_puzzle_embedding_float64."""
    bugs = _manifest()["upstream_bugs"]
    assert (
        bugs["softmax_cross_entropy"].startswith("TypeError:")
        and "valid_mask" in bugs["softmax_cross_entropy"]
    )
    assert bugs["no_ACT_continue=False"].startswith("ValueError: not enough values to unpack")
    assert bugs["puzzle_emb_ndim=0"].startswith("RuntimeError:")  # 18 (with prefix) vs 16 rows
