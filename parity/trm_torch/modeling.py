"""Our PyTorch TRM and its variants (upstream models/recursive_reasoning/), written for this
project, with upstream's attribute names so state_dict keys are upstream's.

The port models/trm/modeling.py mirrors this file class for class. `Block` and `ReasoningModule` are
upstream trm.py's TinyRecursiveReasoningModel_ACTV1Block / _ReasoningModule; the five inners (one
ACT step of recursion: trm.py, hrm.py, trm_singlez.py, trm_hier6.py, transformers_baseline.py)
share `InnerBase` and are picked from `INNERS` by `TRMConfig.arch`; the ACT wrapper and its carry
keep upstream's names, TinyRecursiveReasoningModel_ACTV1 and TinyRecursiveReasoningModel_ACTV1Carry.
`build_model(TRMConfig)` builds the wrapper.

Axis names in variable suffixes: B batch, L positions (puzzle prefix + tokens), D hidden size,
V vocabulary, P puzzle_emb_ndim.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from models.trm.config import variant_fields
from parity.trm_torch.layers import (
    Attention,
    CastedEmbedding,
    CastedLinear,
    CastedSparseEmbedding,
    RotaryEmbedding,
    SwiGLU,
    rms_norm,
    trunc_normal_,
)


class Block(nn.Module):
    """Post-norm block: attention + SwiGLU, or (mlp_t) a token-mixing SwiGLU + SwiGLU."""

    def __init__(self, config):
        super().__init__()
        # config.block_mlp_t: mlp_t, except for the transformers_baseline (attention blocks only)
        self.use_mlp_t = config.block_mlp_t
        if self.use_mlp_t:
            self.mlp_t = SwiGLU(config.total_len, config.expansion)
        else:
            self.self_attn = Attention(config.hidden_size, config.head_dim, config.num_heads)
        self.mlp = SwiGLU(config.hidden_size, config.expansion)
        self.norm_eps = config.rms_norm_eps

    def forward(self, cos_sin, hidden_states):
        h_bld = hidden_states
        if self.use_mlp_t:
            h_bdl = h_bld.transpose(1, 2)  # the MLP and the norm act over tokens
            h_bdl = rms_norm(h_bdl + self.mlp_t(h_bdl), self.norm_eps)
            h_bld = h_bdl.transpose(1, 2)
        else:
            h_bld = rms_norm(
                h_bld + self.self_attn(cos_sin=cos_sin, hidden_states=h_bld), self.norm_eps
            )
        return rms_norm(h_bld + self.mlp(h_bld), self.norm_eps)


class ReasoningModule(nn.Module):
    """h <- h + injection (once), then the blocks in order."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, hidden_states, input_injection=None, cos_sin=None):
        h_bld = hidden_states
        if input_injection is not None:
            h_bld = h_bld + input_injection
        for layer in self.layers:
            h_bld = layer(cos_sin=cos_sin, hidden_states=h_bld)
        return h_bld


class InnerBase(nn.Module):
    """What every inner shares (upstream repeats it in each file): token/puzzle/position
    embeddings, lm_head, q_head, RoPE, the latent init buffers, carry reset and the heads."""

    latent_names = ("z_H", "z_L")
    init_names = ("H_init", "L_init")

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.forward_dtype = getattr(torch, config.forward_dtype)
        self.embed_scale = math.sqrt(config.hidden_size)
        std = 1.0 / self.embed_scale
        self.embed_tokens = CastedEmbedding(
            config.vocab_size, config.hidden_size, std, self.forward_dtype
        )
        self.lm_head = CastedLinear(config.hidden_size, config.vocab_size, bias=False)
        self.q_head = CastedLinear(config.hidden_size, 2, bias=True)
        self.puzzle_emb_len = config.prefix_len
        if config.puzzle_emb_ndim > 0:
            self.puzzle_emb = CastedSparseEmbedding(
                config.num_puzzle_identifiers,
                config.puzzle_emb_ndim,
                config.batch_size,
                0,
                self.forward_dtype,
            )
        if config.pos_encodings == "rope":
            self.rotary_emb = RotaryEmbedding(
                config.head_dim, config.total_len, config.rope_theta, self.forward_dtype
            )
        elif config.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(
                config.total_len, config.hidden_size, std, self.forward_dtype
            )
        self._build(config)
        for name in self.init_names:
            buf = trunc_normal_(torch.empty(config.hidden_size, dtype=self.forward_dtype), 1.0)
            setattr(self, name, nn.Buffer(buf, persistent=True))
        # Q head starts (almost) at zero so nothing halts early in training from scratch
        with torch.no_grad():
            self.q_head.weight.zero_()
            self.q_head.bias.fill_(-5)

    def _build(self, config):
        raise NotImplementedError

    def _input_embeddings(self, inputs, puzzle_identifiers):
        c = self.config
        embedding_bld = self.embed_tokens(inputs.to(torch.int32))
        if c.puzzle_emb_ndim > 0:
            puzzle_bp = self.puzzle_emb(puzzle_identifiers)
            pad = self.puzzle_emb_len * c.hidden_size - puzzle_bp.shape[-1]
            if pad > 0:
                puzzle_bp = F.pad(puzzle_bp, (0, pad))
            embedding_bld = torch.cat(
                (puzzle_bp.view(-1, self.puzzle_emb_len, c.hidden_size), embedding_bld), dim=-2
            )
        if c.pos_encodings == "learned":
            # scale by 1/sqrt(2) to keep the forward variance (upstream's constant)
            embedding_bld = 0.707106781 * (
                embedding_bld + self.embed_pos.embedding_weight.to(self.forward_dtype)
            )
        # everything, puzzle prefix included, is scaled by sqrt(hidden)
        return self.embed_scale * embedding_bld

    def empty_carry(self, batch_size):
        shape = (batch_size, self.config.total_len, self.config.hidden_size)
        return {n: torch.zeros(shape, dtype=self.forward_dtype) for n in self.latent_names}

    def reset_carry(self, reset_flag, carry):
        flag_b11 = reset_flag.view(-1, 1, 1)
        return {
            n: torch.where(flag_b11, getattr(self, i), carry[n])
            for n, i in zip(self.latent_names, self.init_names, strict=True)
        }

    def heads(self, z_bld):
        logits_blv = self.lm_head(z_bld)[:, self.puzzle_emb_len :]
        # first puzzle-prefix position; upstream casts to float32 ("at least": float64 stays)
        q_b2 = self.q_head(z_bld[:, 0]).to(torch.promote_types(torch.float32, z_bld.dtype))
        return logits_blv, (q_b2[..., 0], q_b2[..., 1])

    def recursion(self, carry, x_bld, cos_sin):
        """Returns (new latents, the latent read by the heads)."""
        raise NotImplementedError

    def forward(self, carry, batch):
        cos_sin = self.rotary_emb() if hasattr(self, "rotary_emb") else None
        x_bld = self._input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
        new_carry, z_bld = self.recursion(carry, x_bld, cos_sin)
        new_carry = {k: v.detach() for k, v in new_carry.items()}
        logits_blv, q = self.heads(z_bld)
        return new_carry, logits_blv, q


class TRMInner(InnerBase):
    """trm.py's TinyRecursiveReasoningModel_ACTV1_Inner: one shared `L_level` updates both latents."""

    def _build(self, config):
        self.L_level = ReasoningModule([Block(config) for _ in range(config.L_layers)])

    def _cycle(self, z_H, z_L, x_bld, cos_sin):
        for _ in range(self.config.L_cycles):
            z_L = self.L_level(z_L, z_H + x_bld, cos_sin)
        return self.L_level(z_H, z_L, cos_sin), z_L

    def recursion(self, carry, x_bld, cos_sin):
        z_H, z_L = carry["z_H"], carry["z_L"]
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        return {"z_H": z_H, "z_L": z_L}, z_H


class HRMInner(InnerBase):
    """hrm.py's HierarchicalReasoningModel_ACTV1_Inner: two modules, 1-step gradient."""

    def _build(self, config):
        self.H_level = ReasoningModule([Block(config) for _ in range(config.H_layers)])
        self.L_level = ReasoningModule([Block(config) for _ in range(config.L_layers)])

    def recursion(self, carry, x_bld, cos_sin):
        c = self.config
        z_H, z_L = carry["z_H"], carry["z_L"]
        with torch.no_grad():
            for h in range(c.H_cycles):
                for j in range(c.L_cycles):
                    if not (h == c.H_cycles - 1 and j == c.L_cycles - 1):
                        z_L = self.L_level(z_L, z_H + x_bld, cos_sin)
                if h != c.H_cycles - 1:
                    z_H = self.H_level(z_H, z_L, cos_sin)
        # 1-step gradient
        z_L = self.L_level(z_L, z_H + x_bld, cos_sin)
        z_H = self.H_level(z_H, z_L, cos_sin)
        return {"z_H": z_H, "z_L": z_L}, z_H


class SingleZInner(InnerBase):
    """trm_singlez.py: one latent; z_L <- f(z_L + x) L_cycles times, then z_L <- f(z_L)."""

    latent_names = ("z_L",)
    init_names = ("L_init",)

    def _build(self, config):
        self.L_level = ReasoningModule([Block(config) for _ in range(config.L_layers)])

    def _cycle(self, z_L, x_bld, cos_sin):
        for _ in range(self.config.L_cycles):
            z_L = self.L_level(z_L + x_bld, None, cos_sin)
        return self.L_level(z_L, None, cos_sin)

    def recursion(self, carry, x_bld, cos_sin):
        z_L = carry["z_L"]
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_L = self._cycle(z_L, x_bld, cos_sin)
        z_L = self._cycle(z_L, x_bld, cos_sin)
        return {"z_L": z_L}, z_L


class Hier6Inner(InnerBase):
    """trm_hier6.py: six latents; L step j replaces z_L[j] with f(sum z_L, z_H + x); the H step
    uses sum z_L."""

    latent_names = ("z_H", "z_L1", "z_L2", "z_L3", "z_L4", "z_L5", "z_L6")
    init_names = ("H_init", "L1_init", "L2_init", "L3_init", "L4_init", "L5_init", "L6_init")

    def _build(self, config):
        self.L_level = ReasoningModule([Block(config) for _ in range(config.L_layers)])

    def _cycle(self, z_H, z_L, x_bld, cos_sin):
        z_L = list(z_L)
        for j in range(self.config.L_cycles):
            z_L[j] = self.L_level(
                z_L[0] + z_L[1] + z_L[2] + z_L[3] + z_L[4] + z_L[5], z_H + x_bld, cos_sin
            )
        z_H = self.L_level(z_H, z_L[0] + z_L[1] + z_L[2] + z_L[3] + z_L[4] + z_L[5], cos_sin)
        return z_H, z_L

    def recursion(self, carry, x_bld, cos_sin):
        z_H, z_L = carry["z_H"], [carry[n] for n in self.latent_names[1:]]
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        z_H, z_L = self._cycle(z_H, z_L, x_bld, cos_sin)
        return {"z_H": z_H, **dict(zip(self.latent_names[1:], z_L, strict=True))}, z_H


class BaselineInner(InnerBase):
    """transformers_baseline.py's Model_ACTV2_Inner: H_level once per ACT step, with gradient."""

    latent_names = ("z_H",)
    init_names = ("H_init",)

    def _build(self, config):
        self.H_level = ReasoningModule([Block(config) for _ in range(config.H_layers)])

    def recursion(self, carry, x_bld, cos_sin):
        z_H = self.H_level(carry["z_H"], x_bld, cos_sin)
        return {"z_H": z_H}, z_H


INNERS = {
    "trm": TRMInner,
    "hrm": HRMInner,
    "trm_singlez": SingleZInner,
    "trm_hier6": Hier6Inner,
    "transformers_baseline": BaselineInner,
}


@dataclasses.dataclass
class TinyRecursiveReasoningModel_ACTV1Carry:  # upstream's name
    inner_carry: dict  # {"z_H": [B, L, D], "z_L": [B, L, D]} (variants: their own latents)
    steps: torch.Tensor  # int32 [B]
    halted: torch.Tensor  # bool [B]
    current_data: dict  # the batch rows currently held by each slot


class TinyRecursiveReasoningModel_ACTV1(nn.Module):  # upstream's name
    """The ACT wrapper: carry, slot refill, halting, exploration, for every arch.

    `exploration=(uniform [B], min_halt_draw [B])` replaces torch.rand_like / randint_like so both
    frameworks can be fed the same draws; None draws from torch's RNG.
    """

    def __init__(self, config):
        super().__init__()
        refuse_variants(config)  # the port's TRM builds variants; the reference refuses them
        self.config = config
        self.inner = INNERS[config.arch](config)

    @property
    def puzzle_emb(self):
        return self.inner.puzzle_emb

    def initial_carry(self, batch):
        b = batch["inputs"].shape[0]
        return TinyRecursiveReasoningModel_ACTV1Carry(
            inner_carry=self.inner.empty_carry(b),
            steps=torch.zeros(b, dtype=torch.int32),
            halted=torch.ones(b, dtype=torch.bool),
            current_data={k: torch.zeros_like(v) for k, v in batch.items()},
        )

    def _adaptive(self):
        c = self.config
        if c.halt_max_steps <= 1:
            return False
        if c.arch == "transformers_baseline":
            return (self.training and c.act_enabled) or (not self.training and c.act_inference)
        return self.training

    def halting_rule(self, q_halt_b, q_continue_b):
        """Where the Q head halts a row: q_halt > 0 for TRM; q_halt > q_continue for HRM, the
        baseline and no_ACT_continue=False (upstream's rules)."""
        c = self.config
        if c.arch in ("hrm", "transformers_baseline") or not c.no_ACT_continue:
            return q_halt_b > q_continue_b
        return q_halt_b > 0

    def _exploration_draws(self, q_halt_b, new_steps_b, exploration):
        if exploration is not None:
            return exploration
        u_b = torch.rand_like(q_halt_b)
        k_b = torch.randint_like(new_steps_b, low=2, high=self.config.halt_max_steps + 1)
        return u_b, k_b

    def forward(self, carry, batch, exploration=None, compute_target_q=False):
        c = self.config
        halted_b = carry.halted
        new_inner = self.inner.reset_carry(halted_b, carry.inner_carry)
        new_steps_b = torch.where(halted_b, 0, carry.steps)
        new_data = {
            k: torch.where(halted_b.view((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()
        }
        new_inner, logits, (q_halt, q_continue) = self.inner(new_inner, new_data)
        outputs = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}

        with torch.no_grad():
            new_steps_b = new_steps_b + 1
            is_last_b = new_steps_b >= c.halt_max_steps
            new_halted_b = is_last_b
            if self._adaptive():
                new_halted_b = new_halted_b | self.halting_rule(q_halt, q_continue)
                if self.training:
                    u_b, k_b = self._exploration_draws(q_halt, new_steps_b, exploration)
                    min_halt_b = (u_b < c.halt_exploration_prob) * k_b
                    new_halted_b = new_halted_b & (new_steps_b >= min_halt_b)
                want_target = self.training and (
                    compute_target_q
                    if c.arch == "transformers_baseline"
                    else (c.arch == "hrm" or not c.no_ACT_continue)
                )
                if want_target:
                    # upstream TRM unpacks 5 values from this 3-tuple and crashes; fixed here
                    _, _, (nq_halt, nq_cont) = self.inner(new_inner, new_data)
                    outputs["target_q_continue"] = torch.sigmoid(
                        torch.where(is_last_b, nq_halt, torch.maximum(nq_halt, nq_cont))
                    )
        new_carry = TinyRecursiveReasoningModel_ACTV1Carry(
            new_inner, new_steps_b.to(torch.int32), new_halted_b, new_data
        )
        return new_carry, outputs


# The port's public names (models.trm.TRM / TRMCarry)
TRM = TinyRecursiveReasoningModel_ACTV1
TRMCarry = TinyRecursiveReasoningModel_ACTV1Carry


def build_model(config) -> TinyRecursiveReasoningModel_ACTV1:
    return TinyRecursiveReasoningModel_ACTV1(config)


class NoUpstreamTwin(ValueError):
    """A config of a model upstream does not have (a field the reference does not implement set
    away from its default: models.trm.config.variant_fields); one line naming the field."""


_RECIPE = "docs/architecture.md, 'Changing the model where upstream has no counterpart'"


def refuse_variants(config) -> None:
    """NoUpstreamTwin naming the fields of `config` that make it a variant without an upstream
    twin: this reference builds upstream's models only, and ignoring such a field would make a
    parity test compare the variant with upstream's model under the variant's name."""
    variants = variant_fields(config)
    if variants:
        given = ", ".join(f"model.{k}={v!r}" for k, v in variants.items())
        raise NoUpstreamTwin(
            f"{given}: the PyTorch reference implements upstream's TRM only; it has no "
            f"{', '.join(variants)} (a variant without an upstream twin: {_RECIPE})"
        )
