"""nanoGPT's optimisation: 20 iterations through models.gpt.training vs torch, in float64,
within the one-ulp envelope of the reference's own trajectory (parity/envelope.py)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax
import pytest
from flax import nnx

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from models.gpt import clip_by_global_norm, configure_optimizers, decay_mask, train_step  # noqa: E402
from models.gpt.training import lr_schedule  # noqa: E402
from parity import gpt_torch, report_gpt  # noqa: E402
from parity.compare import FLOAT64, assert_all_close, assert_close  # noqa: E402
from parity.envelope import assert_within_envelope, measure_envelope, perturbed_copies  # noqa: E402
from parity.gpt_params import from_torch, to_torch  # noqa: E402

TINY = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
LR = dict(learning_rate=3e-3, warmup_iters=5, lr_decay_iters=15, min_lr=3e-4)  # all 3 phases
ITERS, ACCUM, BATCH = 20, 2, 2
GRAD_CLIP = 1.6  # between the smallest and largest raw norms of this run: clips some steps only
ENVELOPE_SEEDS = (1, 2)


def _batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (ITERS, ACCUM, BATCH, TINY["block_size"])
    x = torch.randint(0, TINY["vocab_size"], shape, generator=g)
    # A learnable rule (next token = token + 1) so the loss actually moves.
    return x, (x + 1) % TINY["vocab_size"]


def _jax_run(state_dict, x, y, *, grad_clip, dtype="float64", flat=False):
    """The trainer's pattern: split (model, optimizer), jax.jit the pure train_step with the
    graphdef bound."""
    model = from_torch(state_dict, report_gpt.GPTConfig(**TINY, dtype=dtype))
    tx = configure_optimizers(
        weight_decay=0.1, learning_rate=lr_schedule(**LR), betas=(0.9, 0.95), flat=flat
    )
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    step = jax.jit(functools.partial(train_step, graphdef, grad_clip=grad_clip))

    losses, norms = [], []
    for it in range(ITERS):
        state, metrics = step(state, {"x": x[it], "y": y[it]})
        losses.append(float(metrics["loss"]))
        norms.append(float(metrics["grad_norm"]))
    model, _ = nnx.merge(graphdef, state)
    return model, np.array(losses), np.array(norms)


def _torch_records(tmodel, micro):
    """nanoGPT's loop on the reference; per iteration its loss, the final weights with the last."""
    opt = tmodel.configure_optimizers(0.1, LR["learning_rate"], (0.9, 0.95), "cpu")
    losses = gpt_torch.train_iterations(tmodel, opt, micro, grad_clip=GRAD_CLIP, lr_kwargs=LR)
    records = [({}, {"loss": np.float64(v)}) for v in losses]
    records[-1][1].update({k: v.numpy() for k, v in tmodel.state_dict().items()})
    return records


def test_twenty_iterations_match_torch_adamw_float64(x64):
    """Losses of 20 iterations and the final weights within the one-ulp envelope of the
    reference's own trajectory (parity/envelope.py: one ulp of every initial weight, the same 20
    iterations, how far the reference moves), for optax.adamw per tensor and for
    optim.adamw_flat (Adam's moments over one flat vector)."""
    torch.manual_seed(0)
    tmodel = gpt_torch.GPT(gpt_torch.GPTConfig(**TINY)).double()
    start = {k: v.clone() for k, v in tmodel.state_dict().items()}
    x, y = _batches()
    micro = [[(x[it, a], y[it, a]) for a in range(ACCUM)] for it in range(ITERS)]
    perturbed = [_torch_records(m, micro) for m in perturbed_copies(tmodel, ENVELOPE_SEEDS)]
    ref = _torch_records(tmodel, micro)
    envelope = measure_envelope(ref, perturbed)
    t_losses = [float(floats["loss"]) for _, floats in ref]

    # the test exercises what it claims: training moves the loss, and (below) clipping is on in
    # some steps and off in others.
    assert t_losses[-1] < t_losses[0] - 0.1, t_losses
    for flat in (False, True):
        jmodel, j_losses, norms = _jax_run(
            start, x.numpy(), y.numpy(), grad_clip=GRAD_CLIP, flat=flat
        )
        assert (norms > GRAD_CLIP).any() and (norms < GRAD_CLIP).any(), norms
        port = [({}, {"loss": v}) for v in j_losses]
        port[-1][1].update(to_torch(jmodel))
        assert_within_envelope(port, ref, envelope)
    t_final = tmodel.state_dict()
    moved = max(float((t_final[k] - start[k]).abs().max()) for k in t_final)
    assert moved > 1e-3  # parameters really changed


def test_xla_divides_by_a_scalar_as_a_multiply_by_its_reciprocal():
    """The trap "XLA divides by a scalar with its reciprocal" (docs/porting_nanogpt.md): jitted,
    `a / s` for a scalar s is computed as `a * (1 / s)`, which rounds differently from IEEE
    division in a share of the elements. Where such a rewrite fires depends on the program around
    it, so two programs with the same formulas (optax.adamw per tensor, and over one flat vector)
    differ in float32 by an ulp or two: the flat variant is proven against torch within the
    envelope instead (the test above), not bit for bit."""
    a = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    s = np.float32(1) - np.float32(0.9)  # Adam's bias correction at step 1
    out = np.asarray(jax.jit(lambda a, s: a / s)(a, s))
    np.testing.assert_array_equal(out, a * (np.float32(1) / s))
    assert (out != a / s).mean() > 0.1


def test_clip_matches_torch_clip_grad_norm(x64):
    g = torch.Generator().manual_seed(1)
    grads = {
        "a": torch.randn(3, 4, generator=g, dtype=torch.float64),
        "b": torch.randn(5, generator=g, dtype=torch.float64),
    }
    params = [torch.nn.Parameter(torch.zeros_like(v)) for v in grads.values()]
    for p, v in zip(params, grads.values()):
        p.grad = v.clone()
    for max_norm in (0.5, 1e3):  # active, inactive
        for p, v in zip(params, grads.values()):
            p.grad = v.clone()
        t_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        clipped, norm = clip_by_global_norm({k: v.numpy() for k, v in grads.items()}, max_norm)
        assert_close(f"norm (max_norm={max_norm})", norm, t_norm, FLOAT64)
        assert_all_close(
            [(f"clipped {k}", clipped[k], p.grad) for k, p in zip(grads, params)], FLOAT64
        )
    # optax's clip omits torch's 1e-6: at these norms it differs by ~1e-6 relative, which
    # FLOAT64 detects (this is why train_step uses clip_by_global_norm).
    leaves = {k: v.numpy() for k, v in grads.items()}
    optax_clipped, _ = optax.clip_by_global_norm(0.5).update(leaves, None)
    ours, _ = clip_by_global_norm(leaves, 0.5)
    with pytest.raises(AssertionError, match="MISMATCH"):
        assert_close("optax vs torch clip", optax_clipped["a"], ours["a"], FLOAT64)


@pytest.mark.slow  # two more compiles; the 20-iteration test already checks accumulation vs torch
def test_gradient_accumulation_is_mean_of_micro_losses(x64):
    """Accumulating 2 micro-batches of 2 == one batch of 4 (losses are per-token means)."""
    from models.gpt import loss_and_grads

    tmodel, jmodel = report_gpt.build_pair(TINY, "float64")
    x, y = _batches()
    xa, ya = x[0].numpy(), y[0].numpy()
    lg = nnx.jit(loss_and_grads)
    loss_acc, g_acc = lg(jmodel, xa, ya)
    loss_one, g_one = lg(jmodel, xa.reshape(1, 4, -1), ya.reshape(1, 4, -1))
    assert_close("accumulated loss", loss_acc, loss_one, FLOAT64)
    assert_all_close(
        [
            (str(p), a, b)
            for (p, a), (_, b) in zip(
                jax.tree.leaves_with_path(g_acc), jax.tree.leaves_with_path(g_one)
            )
        ],
        FLOAT64,
    )


def test_decay_mask_groups_match_spec_shakespeare_char():
    """nanoGPT's groups for shakespeare_char: decay 26 tensors / 10,740,096; no decay 13 / 4,992."""
    from models.gpt import GPT, preset

    abstract = nnx.eval_shape(lambda: GPT(preset("shakespeare_char"), rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    mask, leaves = jax.tree.leaves(decay_mask(params)), jax.tree.leaves(params)
    decay = [p for m, p in zip(mask, leaves) if m]
    no_decay = [p for m, p in zip(mask, leaves) if not m]
    assert (len(decay), sum(int(np.prod(p.shape)) for p in decay)) == (26, 10_740_096)
    assert (len(no_decay), sum(int(np.prod(p.shape)) for p in no_decay)) == (13, 4_992)


def test_train_step_with_dropout_under_jit_advances_the_rng():
    """Dropout > 0 inside the accumulation scan (the trainer's jit pattern): masks differ per micro-step."""
    from models.gpt import GPT, GPTConfig

    cfg = GPTConfig(**{**TINY, "dropout": 0.2})
    model = GPT(cfg, rngs=nnx.Rngs(params=0, dropout=1))
    optimizer = nnx.Optimizer(
        model, configure_optimizers(weight_decay=0.1, learning_rate=1e-3), wrt=nnx.Param
    )
    x, y = (t[0].numpy() for t in _batches())
    same_x, same_y = np.stack([x[0], x[0]]), np.stack([y[0], y[0]])  # two identical micro-batches
    model.eval()
    eval_loss = float(model(same_x[0], same_y[0])[1])  # the same weights without dropout
    model.train()
    graphdef, state = nnx.split((model, optimizer))
    step = jax.jit(functools.partial(train_step, graphdef, grad_clip=1.0))

    state, m1 = step(state, {"x": same_x, "y": same_y})
    model, _ = nnx.merge(graphdef, state)
    counts = [int(c) for c in jax.tree.leaves(nnx.state(model, nnx.RngCount))]
    assert counts and all(c == ACCUM for c in counts), counts  # one draw per site per micro-step
    # the step's loss (before its update) is a dropout loss, not the eval loss
    assert np.isfinite(float(m1["loss"])) and abs(float(m1["loss"]) - eval_loss) > 1e-4
