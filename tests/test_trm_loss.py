"""models.trm.act_loss against hand-computed values and against our torch ACTLossHead."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.trm import TRMCarry, act_loss
from models.trm.losses import normalize_metrics
from parity.compare import EXACT, FLOAT32, FLOAT64, assert_all_close, assert_close


def _carry(labels, halted, steps):
    labels = jnp.asarray(labels, jnp.int32)
    return TRMCarry(
        inner_carry={},
        steps=jnp.asarray(steps, jnp.int32),
        halted=jnp.asarray(halted, bool),
        current_data={"labels": labels, "inputs": jnp.zeros_like(labels)},
    )


def test_stablemax_known_values(x64):
    # row 0: logits (0, 1, -1), label 1: s = (1, 2, 1/2) -> p = 2/3.5; second token ignored
    # row 1: every label ignored -> no loss, count 0 (excluded from the metrics)
    logits = jnp.asarray([[[0.0, 1.0, -1.0], [5.0, 0.0, 0.0]], [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
    carry = _carry([[1, -100], [-100, -100]], [True, True], [3, 5])
    q_halt = jnp.asarray([0.5, -2.0], jnp.float32)
    out = {
        "logits": logits,
        "q_halt_logits": q_halt,
        "q_continue_logits": jnp.zeros(2, jnp.float32),
    }
    loss, m = act_loss(carry, out)
    lm = -math.log(2 / 3.5)
    # row 0 is exactly right (argmax 1 == label 1) -> BCE target 1; row 1 has no labels -> "correct"
    bce = math.log1p(math.exp(-0.5)) + math.log1p(math.exp(2.0))  # BCE(x, 1) = log(1 + e^-x)
    assert_close("lm_loss", m["lm_loss"], np.float64(lm), FLOAT64)
    assert_close("q_halt_loss", m["q_halt_loss"], np.float64(bce), FLOAT32)
    assert_close("loss", loss, np.float64(lm + 0.5 * bce), FLOAT32)
    expected = {"count": 1, "accuracy": 1.0, "exact_accuracy": 1, "q_halt_accuracy": 1, "steps": 3}
    assert_all_close([(k, m[k], np.asarray(v)) for k, v in expected.items()], EXACT)


def test_stablemax_is_really_float64(x64):
    """Fails if the float64 loss is silently computed in float32 (e.g. x64 off, or a cast)."""
    rng = np.random.default_rng(0)
    logits64 = rng.standard_normal((2, 64, 11)) * 3
    labels = rng.integers(0, 11, (2, 64))
    s = np.where(logits64 < 0, 1 / (1 - logits64 + 1e-30), logits64 + 1)
    logp = np.log(s / s.sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, labels[..., None], -1)[..., 0].sum(-1) / 64
    expected = expected.sum()
    carry = _carry(labels, [True, True], [1, 1])
    out = {
        "logits": jnp.asarray(logits64),
        "q_halt_logits": jnp.zeros(2),
        "q_continue_logits": jnp.zeros(2),
    }
    _, m = act_loss(carry, out)
    assert m["lm_loss"].dtype == jnp.float64
    assert_close("lm_loss float64", m["lm_loss"], expected, FLOAT64)
    # the check discriminates: the same loss in float32 misses FLOAT64
    _, m32 = act_loss(carry, out, loss_dtype="float32")
    with pytest.raises(AssertionError):
        assert_close("lm_loss float32", m32["lm_loss"], expected, FLOAT64)


def test_float64_loss_refuses_without_x64():
    # x64 off here whatever ran before in this worker: a module-scoped fixture that trains TRM
    # in-process turns it on before the per-test reset (tests/conftest.py) records its value
    with jax.enable_x64(False):
        carry = _carry([[1, 2]], [True], [1])
        out = {
            "logits": jnp.zeros((1, 2, 3)),
            "q_halt_logits": jnp.zeros(1),
            "q_continue_logits": jnp.zeros(1),
        }
        with pytest.raises(ValueError, match="x64"):
            act_loss(carry, out)
        loss, _ = act_loss(carry, out, loss_dtype="float32")  # explicit opt-in works
        assert loss.dtype == jnp.float32


def test_float32_stablemax_gradient_is_finite_at_logit_one():
    """A logit of exactly 1.0 (frequent in bf16) gave a NaN gradient with loss_dtype=float32.

    where(x < 0, 1/(1 - x + 1e-30), x + 1) also differentiates the unused branch: at x == 1 its
    gradient is -1e60, inf in float32, and inf * 0 = NaN. Found through a bf16 TRM step
    (tests/test_trm_attention_impl.py). Expected: d/dx_i of -log(s_i / sum s) by hand.
    """
    x = jnp.asarray([[[1.0, -0.5, 2.0]]], jnp.float32)
    carry = _carry([[2]], [True], [1])
    out = {"q_halt_logits": jnp.zeros(1), "q_continue_logits": jnp.zeros(1)}
    # q_halt's target uses argmax under stop_gradient: only lm_loss depends on the logits
    grad = jax.grad(lambda lg: act_loss(carry, {**out, "logits": lg}, loss_dtype="float32")[0])(x)
    s = np.array([2.0, 1 / 1.5, 3.0])  # s(x) = x + 1 for x >= 0, 1 / (1 - x) below
    ds = np.array([1.0, 1 / 1.5**2, 1.0])
    expected = ds * (1 / s.sum() - np.array([0.0, 0.0, 1.0]) / s)  # label 2
    assert_close("d lm_loss / d logits", grad[0, 0], expected, FLOAT32)


@pytest.mark.parametrize("loss_type", ["stablemax_cross_entropy", "softmax_cross_entropy"])
def test_loss_head_matches_torch(loss_type, x64):
    """Same (carry, outputs) into our torch ACTLossHead and act_loss: loss and every metric."""
    torch = pytest.importorskip("torch")
    from parity.trm_torch import ACTLossHead
    from parity.trm_torch.modeling import TinyRecursiveReasoningModel_ACTV1Carry as Carry

    rng = np.random.default_rng(1)
    b, s, v = 6, 12, 7
    labels = rng.integers(0, v, (b, s))
    labels[rng.random((b, s)) < 0.3] = -100
    labels[4] = -100  # a row with no labels at all
    logits = rng.standard_normal((b, s, v)).astype(np.float32)
    logits[1] = np.eye(v)[np.where(labels[1] < 0, 0, labels[1])] * 3  # an exactly-right row
    halted = np.array([1, 1, 0, 1, 1, 0], bool)
    steps = rng.integers(1, 16, b).astype(np.int32)
    q = rng.standard_normal((3, b)).astype(np.float32)
    target = 1 / (1 + np.exp(-q[2]))

    class _Fixed(torch.nn.Module):  # feeds the fixed step result into the real head
        def forward(self, **_):
            carry = Carry(
                {},
                torch.from_numpy(steps),
                torch.from_numpy(halted),
                {"labels": torch.from_numpy(labels)},
            )
            out = {
                "logits": torch.from_numpy(logits),
                "q_halt_logits": torch.from_numpy(q[0]),
                "q_continue_logits": torch.from_numpy(q[1]),
                "target_q_continue": torch.from_numpy(target),
            }
            return carry, out

    _, t_loss, t_metrics, _, _ = ACTLossHead(_Fixed(), loss_type)()
    carry = _carry(labels, halted, steps)
    out = {
        "logits": jnp.asarray(logits),
        "q_halt_logits": jnp.asarray(q[0]),
        "q_continue_logits": jnp.asarray(q[1]),
        "target_q_continue": jnp.asarray(target),
    }
    j_loss, j_metrics = act_loss(carry, out, loss_type=loss_type)
    assert (
        set(j_metrics)
        == set(t_metrics)
        == {
            "count",
            "accuracy",
            "exact_accuracy",
            "q_halt_accuracy",
            "steps",
            "lm_loss",
            "q_halt_loss",
            "q_continue_loss",
        }
    )
    assert_all_close(
        [
            (k, j_metrics[k], t_metrics[k])
            for k in ("count", "exact_accuracy", "q_halt_accuracy", "steps")
        ],
        EXACT,
    )
    lm_tol = (
        FLOAT64 if loss_type == "stablemax_cross_entropy" else FLOAT32
    )  # softmax CE is float32 upstream
    assert_close("lm_loss", j_metrics["lm_loss"], t_metrics["lm_loss"], lm_tol)
    assert_all_close(
        [(k, j_metrics[k], t_metrics[k]) for k in ("accuracy", "q_halt_loss", "q_continue_loss")]
        + [("loss", j_loss, t_loss)],
        FLOAT32,
    )
    assert int(j_metrics["exact_accuracy"]) >= 1 and int(j_metrics["count"]) == 3


def test_normalize_metrics():
    m = {
        "count": jnp.asarray(4),
        "accuracy": jnp.asarray(3.0),
        "lm_loss": jnp.asarray(8.0),
        "steps": jnp.asarray(20),
    }
    train = normalize_metrics(m, mode="train", global_batch_size=16)
    assert (
        float(train["accuracy"]) == 0.75
        and float(train["lm_loss"]) == 0.5
        and float(train["steps"]) == 5
    )
    ev = normalize_metrics(m, mode="eval")
    assert float(ev["lm_loss"]) == 2.0 and float(ev["accuracy"]) == 0.75
