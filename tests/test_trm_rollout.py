"""16 ACT steps, train and eval mode, float64: carry, steps, halted flags, slot refill, outputs,
loss and metrics identical to the torch reference at every step. Some rows halt early (q_head
bias 0 and random q weights put q_halt on both sides of 0), exploration draws (probability 0.5)
are fed to both sides, and every step brings a new batch so refill of halted slots is exercised.

Integer state (steps, halted, current_data) must be EXACT. Float state is float64; random-weight
recursion amplifies round-off (measured, docs/porting_trm.md "precision floor"): with attention and
one L cycle the drift stays < 1e-12 over 16 steps, so TRAJECTORY_F64 holds; the mlp_t recursion is
chaotic (float64 round-off grows ~3-4x per ACT step, 6e-15 at step 1 -> 1e-5 at step 16 in eval),
so its rollout uses a bound that grows 4x per step from FLOAT64.
"""

import numpy as np
import pytest

pytest.importorskip("torch")

from parity.compare import EXACT, FLOAT32, FLOAT64, TRAJECTORY_F64, Tolerance, assert_all_close  # noqa: E402
from parity.report_trm import make_pair, rollout, tiny_config, to_float64  # noqa: E402


def _lyapunov(step: int) -> Tolerance:
    return Tolerance(
        f"float64-x4^{step}",
        FLOAT64.rtol * 4.0**step,
        why="float64 round-off amplified by the measured <=4x per-ACT-step growth of mlp_t recursion",
    )


def _run(variant, train, tol=None, on_step=None, **overrides):
    cfg = tiny_config(variant, "float64", halt_exploration_prob=0.5, **overrides)
    head, model = to_float64(*make_pair(cfg, 0, q_bias=0.0))
    halted_history, refills = [], 0
    for step, exact_rows, float_rows in rollout(head, model, cfg, train=train):
        if on_step is not None:  # sees the rows before they are compared
            on_step(step, exact_rows, float_rows)
        assert_all_close([(f"step {step + 1} {n}", a, e) for n, a, e in exact_rows], EXACT)
        t = tol or _lyapunov(step)
        # `accuracy` is a float32 sum by upstream's definition (is_correct.to(float32) / divisor)
        f32 = [r for r in float_rows if r[0] == "metrics.accuracy"]
        f64 = [r for r in float_rows if r[0] != "metrics.accuracy"]
        assert_all_close([(f"step {step + 1} {n}", a, e) for n, a, e in f64], t)
        assert_all_close([(f"step {step + 1} {n}", a, e) for n, a, e in f32], FLOAT32)
        halted = np.asarray(dict((n, a) for n, a, _ in exact_rows)["halted"])
        halted_history.append(halted)
        if step > 0:
            refills += int(halted_history[-2].sum())
    return np.stack(halted_history), refills


def _assert_halting_exercised(halted, refills):
    first_halt = halted.argmax(axis=0)
    assert halted[:-1].any(), "no row halted before step 16: halting was not exercised"
    assert len(set(first_halt.tolist())) > 1, f"every row halted at the same step {first_halt}"
    assert refills > 0


def test_rollout_train_attention_float64(x64):
    _assert_halting_exercised(*_run("att", True, TRAJECTORY_F64, L_cycles=1))


def test_rollout_eval_attention_float64(x64):
    halted, _ = _run("att", False, TRAJECTORY_F64, L_cycles=1)
    # eval: halting ignores the q head; every row runs exactly halt_max_steps
    assert not halted[:-1].any() and halted[-1].all()


def test_rollout_train_mlp_t_float64(x64):
    _assert_halting_exercised(*_run("mlp_t", True))


@pytest.mark.slow
def test_rollout_eval_mlp_t_float64(x64):
    halted, _ = _run("mlp_t", False)
    assert not halted[:-1].any() and halted[-1].all()


def test_rollout_hrm_train_float64(x64):
    """HRM: q_halt > q_continue rule and target_q_continue from the second inner call."""
    halted, refills = _run("hrm", True, TRAJECTORY_F64, L_cycles=1)
    _assert_halting_exercised(halted, refills)


def test_rollout_trm_no_act_continue_train_float64(x64):
    """TRM with no_ACT_continue=False. Upstream unpacks 5 values from the 3-tuple of the second
    inner call and crashes; the decision (reference and port) is HRM's working path: halt when
    q_halt > q_continue, and `target_q_continue` = sigmoid(q of that second call) gives a
    `q_continue_loss`. Pinned against the reference over 16 train steps, with the two halting rules
    disagreeing on some rows (so the rule is observed, not assumed). Reverting the port to the
    q_halt > 0 rule fails the EXACT `halted` row; dropping the second call loses
    target_q_continue / q_continue_loss; the upstream unpack crashes."""
    seen = {"disagree": 0, "steps": 0}

    def on_step(step, exact_rows, float_rows):
        values = {n: np.asarray(a) for n, a, _ in float_rows}
        assert {"target_q_continue", "metrics.q_continue_loss"} <= set(values), sorted(values)
        q_halt, q_cont = values["q_halt_logits"], values["q_continue_logits"]
        seen["disagree"] += int(((q_halt > 0) != (q_halt > q_cont)).sum())
        seen["steps"] += 1

    halted, refills = _run(
        "att", True, TRAJECTORY_F64, on_step=on_step, L_cycles=1, no_ACT_continue=False
    )
    _assert_halting_exercised(halted, refills)
    assert seen["steps"] == 16 and seen["disagree"] > 0, seen
