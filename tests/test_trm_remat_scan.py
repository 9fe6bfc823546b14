"""`remat` (jax.checkpoint around every block, with a `remat_policy`), `scan` (lax.scan over the
L cycles) and `split_gate_up` (SwiGLU's gate and up as two matmuls) are pure implementation
choices: outputs, carry and gradients must equal the unrolled model's."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.extend.core import jaxprs_in_params

from models.trm import TRM, act_loss
from parity.compare import FLOAT64, assert_all_close
from parity.trm_draws import with_draws
from parity.trm_fixtures import tiny_config


def _cfg(forward_dtype="float32", **kw):
    """parity.trm_fixtures's tiny attention config with 3 L cycles (and 3 puzzle ids)."""
    return tiny_config("att", forward_dtype, **{"L_cycles": 3, "num_puzzle_identifiers": 3, **kw})


def _batch(cfg):
    k1, k2 = jax.random.split(jax.random.key(1))
    return {
        "inputs": jax.random.randint(k1, (cfg.batch_size, cfg.seq_len), 0, cfg.vocab_size),
        "labels": jax.random.randint(k2, (cfg.batch_size, cfg.seq_len), 0, cfg.vocab_size),
        "puzzle_identifiers": jnp.arange(cfg.batch_size, dtype=jnp.int32)
        % cfg.num_puzzle_identifiers,
    }


def _value_and_grads(cfg, batch):
    model = TRM(cfg, rngs=nnx.Rngs(0))
    table = model.inner.puzzle_emb.weights[...]
    model.inner.puzzle_emb.weights[...] = jax.random.normal(
        jax.random.key(2), table.shape, table.dtype
    )
    if cfg.forward_dtype == "float64":  # store weights in float64 too: no float32 rounding left
        for _, var in nnx.iter_graph(model):
            if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState):
                if jnp.issubdtype(var.get_value().dtype, jnp.floating):
                    var.set_value(var.get_value().astype(jnp.float64))
    graphdef, params, rest = nnx.split(with_draws(model), nnx.Param, ...)  # no row explores
    delta = jnp.zeros((cfg.batch_size, cfg.puzzle_emb_ndim), cfg.forward_dtype)

    @jax.jit
    def f(params, delta):
        m = nnx.merge(graphdef, params, rest)
        carry, out = m(m.initial_carry(batch), batch, puzzle_emb_delta=delta)
        loss, _ = act_loss(carry, out)
        return loss, (carry, out)

    (loss, (carry, out)), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(params, delta)
    flat = [
        ("loss", loss),
        *[(k, v) for k, v in out.items()],
        *[(k, v) for k, v in carry.inner_carry.items()],
    ]
    flat += [(".".join(map(str, p)), v.get_value()) for p, v in nnx.to_flat_state(grads[0])]
    flat += [("puzzle_rows_grad", grads[1])]
    return flat


# float32: XLA fuses a checkpointed / scanned body differently, so results differ in the last
# float32 bits (measured up to 9e-6 on z_L); the claim "same computation" is therefore proven in
# float64, where any real difference (a missing cycle, a wrong carry) would be O(1).
CASES = [
    pytest.param("att", "remat+scan", id="att-remat+scan"),
    pytest.param("mlp_t", "remat+dots_saveable", id="mlp_t-remat-dots_saveable"),
    pytest.param("mlp_t", "split_gate_up", id="mlp_t-split_gate_up"),
    pytest.param("att", "split_gate_up", id="att-split_gate_up", marks=pytest.mark.slow),
    pytest.param(
        "att",
        "remat+dots_with_no_batch_dims_saveable",
        id="att-remat-dots_with_no_batch_dims_saveable",
        marks=pytest.mark.slow,
    ),
    pytest.param("mlp_t", "remat", id="mlp_t-remat", marks=pytest.mark.slow),
    pytest.param("mlp_t", "scan", id="mlp_t-scan", marks=pytest.mark.slow),
    pytest.param("att", "remat", id="att-remat", marks=pytest.mark.slow),
    pytest.param("att", "scan", id="att-scan", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("variant,option", CASES)
def test_option_equals_unrolled_float64(variant, option, x64):
    extra = dict(mlp_t=True, pos_encodings="none") if variant == "mlp_t" else {}
    cfg = _cfg(forward_dtype="float64", L_layers=1, L_cycles=3, **extra)
    batch = _batch(cfg)
    ref = _value_and_grads(cfg, batch)
    policy = [p for p in option.split("+") if "saveable" in p]
    alt_cfg = dataclasses.replace(
        cfg,
        remat="remat" in option,
        scan="scan" in option,
        split_gate_up="split_gate_up" in option,
        remat_policy=policy[0] if policy else cfg.remat_policy,
    )
    alt = _value_and_grads(alt_cfg, batch)
    assert [n for n, _ in ref] == [n for n, _ in alt]
    assert_all_close([(n, a, r) for (n, a), (_, r) in zip(alt, ref, strict=True)], FLOAT64)


def _scans(jaxpr) -> list:
    """Every `scan` equation in a (closed) jaxpr, nested ones (pjit, checkpoint bodies) included."""
    found = []
    for eqn in jaxpr.jaxpr.eqns if hasattr(jaxpr, "jaxpr") else jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn)
        for sub in jaxprs_in_params(eqn.params):
            found.extend(_scans(sub))
    return found


def _step_scans(scan: bool) -> list:
    cfg = _cfg(scan=scan, L_cycles=3)
    model = with_draws(TRM(cfg, rngs=nnx.Rngs(0)))  # no row explores
    batch = _batch(cfg)
    step = lambda b: model(model.initial_carry(b), b)[1]["logits"]  # noqa: E731
    return _scans(jax.make_jaxpr(step)(batch))


def test_scan_really_scans():
    """The scan option must trace one L step, not unroll L_cycles copies (else it is a no-op):
    one scan of length L_cycles per H cycle. Reverting `repeat` to the Python loop leaves none."""
    scans = _step_scans(scan=True)
    assert [e.params["length"] for e in scans] == [3, 3], scans  # H_cycles=2, L_cycles=3


def test_unscanned_model_has_no_scan():
    """The control of test_scan_really_scans: scan=False traces no scan at all, so the count
    there is caused by the option and not by anything else in the step."""
    assert _step_scans(scan=False) == []


def _grad_dot_count(**kw) -> int:
    """dot_generals in the jaxpr of d(loss)/d(params): one block, one cycle, attention variant."""
    from models.trm import act_loss

    cfg = _cfg(L_cycles=1, H_cycles=1, L_layers=1, **kw)
    model = TRM(cfg, rngs=nnx.Rngs(0))
    batch = _batch(cfg)
    graphdef, params, rest = nnx.split(with_draws(model), nnx.Param, ...)  # no row explores

    def loss(params):
        m = nnx.merge(graphdef, params, rest)
        carry, out = m(m.initial_carry(batch), batch)
        return act_loss(carry, out, loss_dtype="float32")[0]

    return str(jax.make_jaxpr(jax.grad(loss))(params)).count("dot_general")


def test_remat_policy_decides_what_is_recomputed():
    """The policy reaches jax.checkpoint: dots_saveable keeps every matmul output (as many
    dot_generals in the gradient as without remat), dots_with_no_batch_dims_saveable recomputes
    the attention einsums (they have batch dims), nothing_saveable every matmul of the block."""
    policies = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")
    counts = {p: _grad_dot_count(remat=True, remat_policy=p) for p in policies}
    counts["off"] = _grad_dot_count()
    assert (
        counts["off"]
        == counts["dots_saveable"]
        < counts["dots_with_no_batch_dims_saveable"]
        < counts["nothing_saveable"]
    ), counts


def test_unknown_remat_policy_names_the_field():
    with pytest.raises(ValueError, match=r"TRMConfig.remat_policy='dots'.*nothing_saveable"):
        _cfg(remat=True, remat_policy="dots")


def _swiglu_grad_concatenates(*overrides: str) -> int:
    """Concatenates in the lowered real trm_sudoku step whose result is a SwiGLU's gate-and-up
    activation (last axis 2 x its intermediate size): the backward of the split of one matmul."""
    import re

    from models.trm.layers import swiglu_intermediate
    from tests.test_trm_scatter import _lowered_trm_sudoku_step

    widths = {2 * swiglu_intermediate(n, 4) for n in (512, 81 + 16)}  # mlp, mlp_t
    lowered = _lowered_trm_sudoku_step(*overrides)
    shapes = re.findall(r"stablehlo\.concatenate .*?-> tensor<([\dx]+)x\w+>", lowered)
    return sum(len(s.split("x")) == 3 and int(s.split("x")[-1]) in widths for s in shapes)


def test_split_gate_up_leaves_no_gradient_concatenate():
    """With model.split_gate_up the trm_sudoku step's backward copies no gate-and-up activation
    into one (the default's backward has one such concatenate per SwiGLU call it differentiates);
    what it costs or saves on a GPU is measured by `python -m bench gpu` (d.trm_sudoku_variants)."""
    assert _swiglu_grad_concatenates() > 0  # the check sees the copies it guards against
    assert _swiglu_grad_concatenates("model.split_gate_up=true") == 0
