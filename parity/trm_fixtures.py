"""The shared fixtures of the TRM parity tests and of `python -m parity trm`: tiny configs, paired
torch/JAX models holding the same weights, batches, per-block captures of one ACT step on both
sides (parity.capture), gradients, and multi-step rollouts.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np

from parity.compare import FLOAT32, compare, compare_to_reference
from parity.state_dict import to_numpy

VARIANTS = ("mlp_t", "att", "learned", "hrm", "singlez", "hier6", "baseline")


# The one tiny TRM of this repository's tests and fixtures (upstream's field names): every tiny
# config is this plus the changes its test states (the upstream goldens: parity/goldens/trm.py;
# the training parity tests: tests/test_trm_training_parity.py).
TINY = dict(
    batch_size=4,
    seq_len=16,
    puzzle_emb_ndim=64,
    num_puzzle_identifiers=5,
    vocab_size=11,
    H_cycles=2,
    L_cycles=2,
    H_layers=0,
    L_layers=2,
    hidden_size=64,
    expansion=2,
    num_heads=4,
    pos_encodings="rope",
    halt_max_steps=16,
    halt_exploration_prob=0.1,
    puzzle_emb_len=4,
)


def tiny_config(variant: str = "mlp_t", dtype: str = "float32", **overrides):
    """TINY as a TRMConfig (hidden 64, seq 16, prefix 4, vocab 11, batch 4) of `variant` in
    `dtype`, with `overrides`."""
    from models.trm import TRMConfig

    base = dict(TINY, forward_dtype=dtype)
    per_variant = {
        "mlp_t": dict(mlp_t=True, pos_encodings="none"),
        "att": {},
        "learned": dict(pos_encodings="learned"),
        "hrm": dict(arch="hrm", H_layers=2, no_ACT_continue=False),
        "singlez": dict(arch="trm_singlez"),
        "hier6": dict(arch="trm_hier6", L_cycles=3),
        "baseline": dict(arch="transformers_baseline", H_layers=2, act_enabled=True),
    }
    base.update(per_variant[variant])
    base.update(overrides)
    return TRMConfig(**base)


def make_pair(config, seed: int = 0, *, q_bias: float | None = None):
    """(torch ACTLossHead, JAX TRM) holding the same weights.

    Random torch init, then the zero-initialised pieces made non-trivial so they are tested too:
    the puzzle table gets random rows and q_head random weights (bias `q_bias` if given).
    """
    import torch

    from parity.trm_params import from_torch
    from parity.trm_torch import ACTLossHead, build_model

    torch.manual_seed(seed)
    head = ACTLossHead(build_model(config))
    inner = head.model.inner
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        if hasattr(inner, "puzzle_emb"):
            inner.puzzle_emb.weights.copy_(torch.randn(inner.puzzle_emb.weights.shape, generator=g))
        inner.q_head.weight.copy_(0.1 * torch.randn(inner.q_head.weight.shape, generator=g))
        if q_bias is not None:
            inner.q_head.bias.fill_(q_bias)
    model = from_torch(head.state_dict(), config, seed=seed)
    return head, model


def to_float64(head, model):
    """Store every weight in float64 on both sides (values unchanged: they are float32-exact), so a
    float64 run has no float32 rounding left anywhere, gradients included."""
    import jax.numpy as jnp
    import torch
    from flax import nnx

    head.double()
    inner = head.model.inner
    if hasattr(inner, "puzzle_emb"):  # .double() made the grad leaf a non-leaf copy: re-leaf it
        pe = inner.puzzle_emb
        pe.local_weights = torch.zeros(
            pe.local_weights.shape, dtype=torch.float64, requires_grad=True
        )
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState):
            value = var.get_value()
            if jnp.issubdtype(value.dtype, jnp.floating):
                var.set_value(jnp.asarray(value, jnp.float64))
    return head, model


def make_batch(config, seed: int = 0):
    """numpy batch: inputs, labels (with some -100), puzzle_identifiers."""
    rng = np.random.default_rng(seed)
    b, s = config.batch_size, config.seq_len
    labels = rng.integers(1, config.vocab_size, (b, s)).astype(np.int32)
    labels[rng.random((b, s)) < 0.2] = -100
    return {
        "inputs": rng.integers(0, config.vocab_size, (b, s)).astype(np.int32),
        "labels": labels,
        "puzzle_identifiers": rng.integers(0, config.num_puzzle_identifiers, (b,)).astype(np.int32),
    }


def to_jax(batch):
    import jax.numpy as jnp

    return {k: jnp.asarray(v) for k, v in batch.items()}


def to_torch_batch(batch):
    import torch

    return {k: torch.from_numpy(np.asarray(v).copy()) for k, v in batch.items()}


def _is_block(path: str) -> bool:
    """A block of the reasoning levels, by its path under `inner` (the same on both sides)."""
    return re.fullmatch(r"(L_level|H_level)\.layers\.\d+", path) is not None


def _trace(calls, puzzle_emb_len: int) -> list:
    """A capture (parity.capture) as the report's trace: every block output in call order, and
    the input embedding (with its puzzle prefix) where it was computed."""
    trace = []
    for c in calls:
        if c.method == "_input_embeddings":
            x = c.outputs[0]
            trace += [("input_embedding", x), ("puzzle_prefix", x[:, :puzzle_emb_len])]
        elif _is_block(c.path):
            trace.append((c.path, c.outputs[0]))
    return trace


def _select(path: str) -> bool:
    return path == "" or _is_block(path)  # "": the inner itself, for its _input_embeddings


def torch_one_step(head, batch_np):
    """One ACT step from a fresh carry on the torch side, with every block output captured
    (parity.capture.torch_hooks: forward hooks, and InnerBase._input_embeddings wrapped)."""
    import torch

    from parity.capture import torch_hooks

    inner = head.model.inner
    batch = to_torch_batch(batch_np)
    carry = head.initial_carry(batch)
    with torch_hooks(inner, select=_select, methods=("_input_embeddings",)) as calls:
        with torch.no_grad():
            carry, _, _, outputs, _ = head(
                carry=carry,
                batch=batch,
                return_keys=("logits", "q_halt_logits", "q_continue_logits"),
            )
    trace = _trace(calls, inner.puzzle_emb_len)
    for n in inner.latent_names:
        trace.append((n, carry.inner_carry[n]))
    trace.append(("logits", outputs["logits"]))
    trace.append(
        ("q_logits", torch.stack([outputs["q_halt_logits"], outputs["q_continue_logits"]], -1))
    )
    return trace


def jax_one_step(model, batch_np, *, jit: bool = False):
    """One ACT step of the port with every block output captured from outside the model, like
    torch_one_step's hooks (parity.capture.nnx_hooks: Block.__call__ and
    InnerBase._input_embeddings intercepted for the call; the model has no instrumentation of
    its own); latents and outputs are read from the result. The names are torch_one_step's, in
    the same order.

    Eager by default: op-by-op dispatch rounds after every op like torch eager. Under jit XLA fuses
    elementwise chains and keeps excess precision inside a fusion (bf16: computed in f32, rounded
    once), so bf16 results move away from torch's op-by-op rounding (docs/porting_trm.md).
    """
    import jax.numpy as jnp
    from flax import nnx

    from parity.capture import nnx_hooks

    if model.config.scan:  # a block inside lax.scan returns tracers of the scan body
        raise ValueError("jax_one_step captures every L step: build the model with scan=False")
    batch = to_jax(batch_np)
    names: list = []

    def step(model, batch):
        inner = model.inner
        with nnx_hooks(inner, select=_select, methods=("_input_embeddings",)) as calls:
            carry, outputs = model(model.initial_carry(batch), batch)
        trace = _trace(calls, inner.puzzle_emb_len)
        for n in inner.latent_names:
            trace.append((n, carry.inner_carry[n]))
        trace.append(("logits", outputs["logits"]))
        q_logits = jnp.stack([outputs["q_halt_logits"], outputs["q_continue_logits"]], -1)
        trace.append(("q_logits", q_logits))
        names[:] = [n for n, _ in trace]
        return [v for _, v in trace]

    values = (nnx.jit(step) if jit else step)(model, batch)
    return list(zip(names, values, strict=True))


def _paired(jt, tt):
    """(label, jax value, torch value) for two captures of one step: same order, same module
    names. A block runs once per L step: repeated names are numbered ("... [2/6]" = second L step)
    so every row of a table names one tensor."""
    if len(jt) != len(tt):
        raise AssertionError(
            f"capture mismatch: JAX recorded {len(jt)} tensors, torch {len(tt)}:\n"
            f"{[n for n, _ in jt]}\n{[n for n, _ in tt]}"
        )
    total = collections.Counter(n for n, _ in jt)
    seen = collections.Counter()
    out = []
    for (jn, jv), (tn, tv) in zip(jt, tt, strict=True):
        if not jn.endswith(tn):
            raise AssertionError(f"capture order differs: JAX {jn!r} vs torch {tn!r}")
        seen[jn] += 1
        label = f"{jn} [{seen[jn]}/{total[jn]}]" if total[jn] > 1 else jn
        out.append(
            (label, np.asarray(jv.astype("float32") if str(jv.dtype) == "bfloat16" else jv), tv)
        )
    return out


def one_step_comparisons(head, model, batch_np, tol, *, jit: bool = False):
    """Pairs every captured tensor (same order, same module names) and compares it under `tol`;
    `jit=True` runs the port's step as one compiled program (as the trainer does)."""
    pairs = _paired(jax_one_step(model, batch_np, jit=jit), torch_one_step(head, batch_np))
    return [compare(label, jv, tv, tol) for label, jv, tv in pairs]


def float64_twin(head, config):
    """The torch reference holding `head`'s values exactly, computing in float64: the exact value
    a float32 or bfloat16 run approximates (weights are float32, buffers bf16/float32: all exact in
    float64). torch's global RNG is left as it was."""
    import torch

    from parity.trm_torch import ACTLossHead, build_model

    with torch.random.fork_rng():
        twin = ACTLossHead(build_model(dataclasses.replace(config, forward_dtype="float64")))
    twin.load_state_dict(head.state_dict())
    twin.train(head.training)
    return twin


def reference_comparisons(head, model, batch_np, bound, *, jit: bool = False):
    """Every captured tensor of the port and of the torch reference (same low precision) against
    the torch reference in float64, under a ReferenceBound (parity.compare)."""
    exact = float64_twin(head, model.config)
    pairs = _paired(jax_one_step(model, batch_np, jit=jit), torch_one_step(head, batch_np))
    exact_trace = torch_one_step(exact, batch_np)
    return [
        compare_to_reference(label, jv, tv, ev, bound)
        for (label, jv, tv), (_, ev) in zip(pairs, exact_trace, strict=True)
    ]


def rollout_tolerance_for(step: int, name: str):
    """The rollout's one exception to the envelope: `accuracy` is a float32 sum by upstream's
    definition (is_correct.to(float32) / divisor), so it gets float32's bound."""
    return FLOAT32 if name == "metrics.accuracy" else None


def fixed_exploration(config, seed: int = 0):
    """Per-row exploration draws (uniform [B], min_halt_draw [B]) fed to both sides."""
    rng = np.random.default_rng(10_000 + seed)
    b = config.batch_size
    return (
        rng.random(b).astype(np.float32),
        rng.integers(2, config.halt_max_steps + 1, b).astype(np.int32),
    )


def torch_grads(head, batch_np, exploration, loss_type="stablemax_cross_entropy"):
    """Gradients of upstream's loss for one train-mode ACT step from a fresh carry: every
    parameter (by state_dict key) and the gathered puzzle rows (`puzzle_emb.local_weights.grad`)."""
    import torch

    from parity.trm_torch import softmax_cross_entropy, stablemax_cross_entropy

    head.train()
    head.loss_fn = {
        "stablemax_cross_entropy": stablemax_cross_entropy,
        "softmax_cross_entropy": softmax_cross_entropy,
    }[loss_type]
    head.zero_grad(set_to_none=True)
    inner = head.model.inner
    if hasattr(inner, "puzzle_emb"):
        inner.puzzle_emb.local_weights.grad = None
    batch = to_torch_batch(batch_np)
    carry = head.initial_carry(batch)
    expl = tuple(torch.from_numpy(np.asarray(e)) for e in exploration)
    _, loss, _, _, _ = head(carry=carry, batch=batch, exploration=expl)
    loss.backward()
    grads = {k: p.grad for k, p in head.named_parameters() if p.grad is not None}
    if hasattr(inner, "puzzle_emb"):
        grads["puzzle_rows"] = inner.puzzle_emb.local_weights.grad
    return float(loss.detach()), grads


def jax_grads(model, batch_np, exploration, loss_type="stablemax_cross_entropy"):
    """The same from the port: nnx.Param gradients keyed like torch, and d loss / d puzzle_emb_delta."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from models.trm import act_loss
    from parity.trm_draws import with_draws

    model.train()
    batch = to_jax(batch_np)
    graphdef, params, rest = nnx.split(with_draws(model, exploration), nnx.Param, ...)
    cfg = model.config
    table_dtype = (
        model.inner.puzzle_emb.weights[...].dtype if cfg.puzzle_emb_ndim > 0 else jnp.float32
    )
    delta = jnp.zeros((cfg.batch_size, max(cfg.puzzle_emb_ndim, 1)), table_dtype)

    @jax.jit
    def loss_fn(params, delta):
        m = nnx.merge(graphdef, params, rest)
        d = delta if cfg.puzzle_emb_ndim > 0 else None
        carry, out = m(m.initial_carry(batch), batch, puzzle_emb_delta=d)
        loss, _ = act_loss(carry, out, loss_type=loss_type)
        return loss

    loss, (g_params, g_delta) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, delta)
    grads = {
        "model." + ".".join(str(p) for p in path): v.get_value() if hasattr(v, "get_value") else v
        for path, v in nnx.to_flat_state(g_params)
    }
    if cfg.puzzle_emb_ndim > 0:
        grads["puzzle_rows"] = g_delta
    return float(loss), grads


def _rollout_batches(config, steps: int, seed: int):
    """The rollout's inputs: a NEW batch every step (so halted slots are refilled) and the
    exploration draws of that step, the same for both sides."""
    return [
        (make_batch(config, seed + 100 + step), fixed_exploration(config, seed + 100 + step))
        for step in range(steps)
    ]


def _rollout_record(carry, outputs, loss, metrics):
    """One step of a rollout as numpy `(exact, floats)` (either side: the carries have the same
    fields): the integer state, then the carry's latents, the outputs, the loss and the metrics."""
    exact = {"steps": carry.steps, "halted": carry.halted}
    exact.update({f"current_data.{k}": v for k, v in carry.current_data.items()})
    floats = dict(carry.inner_carry, **outputs, loss=loss)
    floats.update({f"metrics.{k}": v for k, v in metrics.items()})
    return (
        {k: to_numpy(v) for k, v in exact.items()},
        {k: to_numpy(v) for k, v in floats.items()},
    )


def torch_rollout(head, config, *, steps: int = 16, train: bool = True, seed: int = 0):
    """`steps` ACT steps of the torch reference; per step `(exact, floats)`: name -> tensor for the
    integer state (steps, halted, current data) and for the float state (carry, outputs, loss,
    metrics)."""
    import torch

    head.train(train)
    batch0 = make_batch(config, seed)
    carry = head.initial_carry(to_torch_batch(batch0))
    out = []
    for batch, expl in _rollout_batches(config, steps, seed):
        with torch.no_grad():
            carry, loss, metrics, outputs, _ = head(
                carry=carry,
                batch=to_torch_batch(batch),
                exploration=tuple(torch.from_numpy(e) for e in expl),
                return_keys=("logits", "q_halt_logits", "q_continue_logits", "target_q_continue"),
            )
        out.append(_rollout_record(carry, outputs, loss, metrics))
    return out


def jitted_act_step():
    """One ACT step of the port and its loss head, freshly jitted:
    (model, carry, batch, exploration) -> (carry, outputs, loss, metrics); `model` is a
    parity.trm_draws.GivenDrawsTRM, and `exploration` its draws for this step (None: those it
    holds; eval mode draws none). Fresh on purpose: a
    cached one would keep a trace of a method the envelope tests monkeypatch."""
    from flax import nnx

    from models.trm import act_loss
    from parity.trm_draws import set_draws

    @nnx.jit
    def act_step(model, carry, batch, exploration):
        if exploration is not None:
            set_draws(model, exploration)
        carry, out = model(carry, batch)
        loss, metrics = act_loss(carry, out)
        return carry, out, loss, metrics

    return act_step


def jax_rollout(
    model, config, *, steps: int = 16, train: bool = True, seed: int = 0, carry_fn=None
):
    """The same rollout through the port, one jitted step per ACT step, in the torch side's
    layout. `carry_fn(step, carry) -> carry`, if given, edits the carry between steps (the
    envelope tests inject a wrong carry with it)."""
    from parity.trm_draws import with_draws

    model.train() if train else model.eval()
    model = with_draws(model)
    jstep = jitted_act_step()
    carry = model.initial_carry(to_jax(make_batch(config, seed)))
    out = []
    for step, (batch, expl) in enumerate(_rollout_batches(config, steps, seed)):
        if carry_fn is not None:
            carry = carry_fn(step, carry)
        carry, outputs, loss, metrics = jstep(model, carry, to_jax(batch), expl)
        out.append(_rollout_record(carry, outputs, loss, metrics))
    return out
