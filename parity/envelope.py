"""Bounds for multi-step parity that come from a measured amplification, not a fixed guess.

A recursion with random weights amplifies round-off: two correct implementations whose kernels sum
in a different order (XLA vs torch, or AVX-512 vs AVX2 builds of either) part by ~1e-16 after one
op and by far more after 16 ACT steps, how much more depends on the model, the step and the CPU. A
fixed bound is either too tight for some CPU or too loose to catch a bug.

The envelope measures the amplification on the reference itself: every floating weight and buffer
of the torch reference is moved by one ulp (up or down, a random sign per element, `seed`), the same
rollout is run again, and the scale-relative distance between the perturbed and the unperturbed
reference is recorded per step and per tensor. That is how far one rounding's worth of difference
grows by that step. The port must stay within `factor` times the envelope (never below FLOAT64):
round-off differences between implementations are a few roundings per op, so they grow the same
way, while a real bug (one weight changed by 1e-9, a carry not carried, a swapped halting rule)
starts far above one ulp and fails at the first step it touches. tests/test_trm_rollout.py shows
both sides: the port passes on this CPU and, in the slow tier, under the emulated AVX2 and SSE4.2
kernels; three injected bugs fail.

Integer state (steps, halted, current data) is compared EXACT; if one ulp of the weights changes a
halting decision of the reference, the envelope of that rollout is meaningless and this says so.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from parity.compare import EXACT, FLOAT64, Comparison, Tolerance, compare

# Measured: the largest (port - reference) / envelope ratio over every step and tensor of the six
# TRM rollouts, the 20-step TRM training parity and nanoGPT's 20 iterations is 3.3 (HRM, train,
# XLA/ATen held to AVX2); 1.7 natively on AVX-512 and 2.0 with SSE4.2/default kernels (table in
# docs/porting_trm.md, "The one-ulp envelope"). 16 leaves ~5x over the worst; the injected bugs
# in tests/test_trm_rollout.py exceed the envelope by many orders of magnitude more.
ENVELOPE_FACTOR = 16.0

# A step is a mapping from a tensor name to its value (numpy-convertible).
Step = dict[str, object]


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def perturb_one_ulp_(module, seed: int) -> None:
    """Move every floating parameter and buffer of a torch module by one ulp, in place.

    The direction (towards +inf or -inf) is drawn per element from `seed`, so repeated envelopes
    with different seeds sample different round-off patterns.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    tensors = list(module.parameters()) + list(module.buffers())
    with torch.no_grad():
        for t in tensors:
            if not t.is_floating_point():
                continue
            up = torch.rand(t.shape, generator=g, dtype=torch.float64) < 0.5
            inf = torch.full_like(t, float("inf"))
            t.copy_(torch.where(up, torch.nextafter(t, inf), torch.nextafter(t, -inf)))


def perturbed_copies(module, seeds: Iterable[int]):
    """Deep copies of a torch module, each moved by one ulp (perturb_one_ulp_) with its own seed."""
    for seed in seeds:
        m = copy.deepcopy(module)
        perturb_one_ulp_(m, seed)
        yield m


@dataclasses.dataclass
class Envelope:
    """Per step, per float tensor: max over the perturbed runs of max|perturbed - ref| / max|ref|;
    the bound of a step uses the largest of them (`at`)."""

    steps: list[dict[str, float]]
    factor: float = ENVELOPE_FACTOR

    def at(self, step: int) -> float:
        """The step's envelope: the largest scale-relative move of any of its float tensors.

        One number per step, not one per tensor: a scalar (a loss, a norm) is a sum whose
        perturbed copies can cancel by chance in two or three samples, while the state it is
        computed from cannot; the largest move of the step is the robust measure of how far
        round-off has grown by then."""
        return max(self.steps[step].values(), default=0.0)

    def tolerance(self, step: int, name: str) -> Tolerance:
        env = self.at(step)
        return tolerance(env, self.factor, label=f" (step {step + 1}: {env:.1e})")


def move(a, e) -> float:
    """How far `a` moved from `e`, scale-relative: max|a - e| / max|e| (max|a - e| where e is all
    zero; infinite when either side is not finite). The measure of every envelope here."""
    a, e = _np(a), _np(e)
    if not (np.isfinite(a).all() and np.isfinite(e).all()):
        return float("inf")
    if e.size == 0:
        return 0.0
    scale = float(np.max(np.abs(e)))
    diff = float(np.max(np.abs(a - e)))
    return diff / scale if scale > 0 else diff


def largest_moves(reference: Mapping, perturbed: Iterable[Mapping]) -> dict:
    """The envelope of named values: per key of `reference`, the largest `move` over the
    perturbed runs (mappings with the same keys; a value may be a list of arrays, whose largest
    move counts). Every envelope of the toolkit is this on its own keys: per module call and
    gradient (parity.check.envelope), per optimizer step and tensor (parity.steps), per rollout
    step and tensor (measure_envelope)."""
    env = dict.fromkeys(reference, 0.0)
    for run in perturbed:
        for key, value in reference.items():
            moved = run.get(key)
            if moved is None:
                continue
            pairs = zip(moved, value) if isinstance(value, list) else [(moved, value)]
            env[key] = max([env[key], *(move(a, e) for a, e in pairs)])
    return env


def tolerance(
    env: float, factor: float = ENVELOPE_FACTOR, floor: float = FLOAT64.rtol, label: str = ""
) -> Tolerance:
    """`factor` times an envelope value, never below `floor`, as a named Tolerance."""
    return Tolerance(
        f"envelope x{factor:g}{label}",
        max(floor, factor * env),
        why=f"one ulp of every reference weight moves this tensor by {env:.1e} of its scale;"
        f" the port may differ by {factor:g}x that (never less than {floor:g})",
    )


def widened(tol: Tolerance, env: Mapping, factor: float = ENVELOPE_FACTOR):
    """tolerance_for(key): `tol`, or `factor` x the envelope of `key` where that is wider (an
    exactly-zero gradient, a recurrence)."""

    def tolerance_for(key) -> Tolerance:
        if key not in env:
            return tol
        bound = tolerance(env[key], factor, floor=tol.rtol)
        return bound if bound.rtol > tol.rtol else tol

    return tolerance_for


def measure_envelope(
    reference: Sequence[tuple[Step, Step]],
    perturbed_runs: Iterable[Sequence[tuple[Step, Step]]],
    factor: float = ENVELOPE_FACTOR,
) -> Envelope:
    """The envelope of `reference` from runs of the same rollout on perturbed weights.

    Each run is a list of per-step `(exact, floats)` pairs of name -> value. The exact tensors of a
    perturbed run must equal the reference's: otherwise one ulp already changed a decision (a halt,
    a refill) and the rollout is too close to a tie to bound; that is an error, not a bound.
    """
    runs = []
    for run in perturbed_runs:
        if len(run) != len(reference):
            raise ValueError(f"perturbed run has {len(run)} steps, the reference {len(reference)}")
        for i, ((ex_p, _), (ex_r, _)) in enumerate(zip(run, reference, strict=True)):
            for name, value in ex_r.items():
                if not compare(name, ex_p[name], value, EXACT).passed:
                    raise ValueError(
                        f"step {i + 1}: one ulp of the reference weights changed {name!r}; the"
                        " rollout sits on a tie (a q logit at ~0?) and has no envelope: change"
                        " the seed or the configuration"
                    )
        runs.append(_by_step(run))
    if not runs:
        raise ValueError("an envelope needs at least one perturbed run")
    moves = largest_moves(_by_step(reference), runs)
    return Envelope([{n: moves[i, n] for n in fl} for i, (_, fl) in enumerate(reference)], factor)


def _by_step(run: Sequence[tuple[Step, Step]]) -> dict[tuple[int, str], object]:
    return {(i, name): v for i, (_, floats) in enumerate(run) for name, v in floats.items()}


def check_within_envelope(
    actual: Sequence[tuple[Step, Step]],
    reference: Sequence[tuple[Step, Step]],
    envelope: Envelope,
    *,
    tolerance_for: Callable[[int, str], Tolerance | None] | None = None,
) -> list[list[Comparison]]:
    """Compare every step of `actual` with `reference`: exact tensors EXACT, float tensors within
    the envelope. `tolerance_for(step, name)` may name another bound for a tensor (or None for
    the envelope). Returns the comparisons of each step; stops at the first step that fails, since
    a trajectory that has left the envelope says nothing more."""
    out = []
    for i, ((ex_a, fl_a), (ex_r, fl_r)) in enumerate(zip(actual, reference, strict=True)):
        rows = [compare(f"step {i + 1} {n}", ex_a[n], v, EXACT) for n, v in ex_r.items()]
        for name, value in fl_r.items():
            tol = (tolerance_for(i, name) if tolerance_for else None) or envelope.tolerance(i, name)
            rows.append(compare(f"step {i + 1} {name}", fl_a[name], value, tol))
        out.append(rows)
        if not all(c.passed for c in rows):
            break
    return out


def assert_within_envelope(actual, reference, envelope: Envelope, **kw) -> list[list[Comparison]]:
    """check_within_envelope, raising with every mismatch of the first failing step."""
    steps = check_within_envelope(actual, reference, envelope, **kw)
    bad = [c for c in steps[-1] if not c.passed] if steps else []
    if bad:
        raise AssertionError(
            f"{len(bad)} of {len(steps[-1])} tensors differ at step {len(steps)}:\n"
            + "\n".join(c.message() for c in bad)
        )
    return steps


def worst_ratio(steps: list[list[Comparison]], envelope: Envelope) -> float:
    """max over the compared float tensors of (scale-relative error) / (the envelope's rtol):
    how much of the bound the port used (1.0 = at the bound)."""
    worst = 0.0
    for rows in steps:
        for c in rows:
            if c.tolerance.name.startswith("envelope"):
                worst = max(worst, c.scale_rel / c.tolerance.rtol)
    return worst
