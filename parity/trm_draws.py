"""The TRM port with its halting exploration draws given instead of drawn, for the parity tests.

In training a TRM row explores when a uniform draw is below halt_exploration_prob, and may then
not halt before a second, integer draw (upstream: torch.rand_like / randint_like). The port draws
both from its own `exploration` RNG stream (models/trm/modeling.py); our torch reference takes them
as an `exploration=` argument. To compare the two, or to replay upstream's recorded draws, the
tests give the port the same numbers from the outside, through this subclass:

    model = with_draws(model, (u_b, k_b))        # same weights, buffers, config and mode
    carry, out = model(carry, batch)             # uses u_b, k_b; the RNG stream is not advanced
    set_draws(model, (u_b, k_b))                 # the next step's draws (also inside a trace)

The draws are nnx Variables of the model, so they travel in its state: split, merged inside jit,
carried through the pure train step (models/trm/training.py), where they land in
TRMTrainState.rest; `state_with_draws` sets them there between steps.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from models.trm import TRM
from models.trm.layers import PuzzleTable


class ExplorationDraw(nnx.Variable):
    """One of the two per-row draws (uniform [B] in [0, 1), min_halt_draw [B] int)."""


class GivenDrawsTRM(TRM):
    """TRM whose `_exploration_draws` returns `given_u`, `given_k` (see the module docstring)."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        b = config.batch_size
        self.given_u = ExplorationDraw(jnp.ones((b,), jnp.float32))  # 1: no row explores
        self.given_k = ExplorationDraw(jnp.full((b,), 2, jnp.int32))

    def _exploration_draws(self, b: int):
        return self.given_u[...], self.given_k[...]


def set_draws(model: GivenDrawsTRM, draws) -> None:
    """The draws (uniform [B], min_halt_draw [B]) the next ACT steps use."""
    u_b, k_b = draws
    model.given_u.set_value(jnp.asarray(u_b, jnp.float32))
    model.given_k.set_value(jnp.asarray(k_b, jnp.int32))


def with_draws(model: TRM, draws=None) -> GivenDrawsTRM:
    """A GivenDrawsTRM with `model`'s weights, buffers, RNG state, config and train/eval mode,
    using `draws` (default: none explores)."""
    out = nnx.eval_shape(lambda: GivenDrawsTRM(model.config, rngs=nnx.Rngs(0)))
    nnx.update(out, nnx.state(model))
    b = model.config.batch_size
    set_draws(out, draws or (jnp.ones((b,), jnp.float32), jnp.full((b,), 2, jnp.int32)))
    out.train() if model.training else out.eval()
    return out


def state_with_draws(graphdef, state, draws):
    """A TRMTrainState of a GivenDrawsTRM (`graphdef`) whose next step uses `draws`."""
    model = nnx.merge(graphdef, state.params, state.table, state.rest)
    set_draws(model, draws)
    return state.replace(rest=nnx.split(model, nnx.Param, PuzzleTable, ...)[3])


def train_state_with_draws(graphdef, state, draws=None):
    """(graphdef, TRMTrainState) of a TRM state's model as a GivenDrawsTRM: the same params,
    table, buffers, optimizer states and EMA, with `draws` (default: none explores)."""
    model = with_draws(nnx.merge(graphdef, state.params, state.table, state.rest), draws)
    graphdef, params, table, rest = nnx.split(model, nnx.Param, PuzzleTable, ...)
    return graphdef, state.replace(params=params, table=table, rest=rest)
