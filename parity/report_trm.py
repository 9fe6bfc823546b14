"""`python -m parity trm [--variant V] [--dtype D]`: per-module parity table for one ACT step,
or (`--rollout train|eval`) a 16-step float64 rollout against its one-ulp envelope.

The fixtures (configs, paired models, captures, rollouts) live in parity/trm_fixtures.py.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from parity.compare import (
    AS_TORCH_BFLOAT16,
    AS_TORCH_FLOAT32,
    BFLOAT16,
    FLOAT32,
    FLOAT64,
    format_reference_table,
    format_table,
)
from parity.trm_fixtures import (
    VARIANTS,
    jax_rollout,
    make_batch,
    make_pair,
    one_step_comparisons,
    reference_comparisons,
    rollout_tolerance_for,
    tiny_config,
    to_float64,
    torch_rollout,
)

TOLERANCES = {"float32": FLOAT32, "float64": FLOAT64, "bfloat16": BFLOAT16}
REFERENCE_BOUNDS = {"float32": AS_TORCH_FLOAT32, "bfloat16": AS_TORCH_BFLOAT16}


def rollout_envelope_rows(variant: str, train: bool, *, seeds=(1, 2), steps: int = 16, **overrides):
    """Per ACT step of a float64 rollout: the worst envelope, the port's worst deviation and their
    ratio over the float tensors (parity/envelope.py), for `python -m parity trm --rollout`."""
    from parity.envelope import check_within_envelope, measure_envelope, perturbed_copies

    cfg = tiny_config(variant, "float64", halt_exploration_prob=0.5, **overrides)
    head, model = to_float64(*make_pair(cfg, 0, q_bias=0.0))
    ref = torch_rollout(head, cfg, train=train, steps=steps)
    env = measure_envelope(
        ref,
        (torch_rollout(h, cfg, train=train, steps=steps) for h in perturbed_copies(head, seeds)),
    )
    compared = check_within_envelope(
        jax_rollout(model, cfg, train=train, steps=steps),
        ref,
        env,
        tolerance_for=rollout_tolerance_for,
    )
    rows = []
    for i, comps in enumerate(compared):
        floats = [c for c in comps if c.tolerance.name.startswith("envelope")]
        # in units of the envelope, floored where the bound is (FLOAT64 / factor)
        ratios = [c.scale_rel / max(env.at(i), FLOAT64.rtol / env.factor) for c in floats]
        worst = max(range(len(floats)), key=lambda j: ratios[j])
        rows.append(
            dict(
                step=i + 1,
                envelope=env.at(i),
                port=max(c.scale_rel for c in floats),
                worst_ratio=ratios[worst],
                worst_tensor=floats[worst].name.split(" ", 2)[2],
                passed=all(c.passed for c in comps),
            )
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity trm", description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=VARIANTS, default="mlp_t")
    p.add_argument("--dtype", choices=tuple(TOLERANCES), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rollout",
        choices=("train", "eval"),
        help="instead of one step: a 16-step float64 rollout against its one-ulp envelope",
    )
    p.add_argument("--L-cycles", type=int, default=None, help="override L_cycles (rollout)")
    p.add_argument("--jit", action="store_true", help="run the port's step jitted (as training)")
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    if args.rollout:
        extra = {} if args.L_cycles is None else dict(L_cycles=args.L_cycles)
        with jax.enable_x64(True):
            rows = rollout_envelope_rows(args.variant, args.rollout == "train", **extra)
        print(
            f"TRM rollout, variant={args.variant} mode={args.rollout} float64: per ACT step, the"
            " one-ulp envelope, the port's deviation (both max|a-e|/max|e|) and their worst ratio"
        )
        print(f"{'step':>4} {'envelope':>10} {'port':>10} {'ratio':>8}  worst tensor")
        for r in rows:
            print(
                f"{r['step']:>4} {r['envelope']:>10.2e} {r['port']:>10.2e} {r['worst_ratio']:>8.2f}"
                f"  {r['worst_tensor']}{'' if r['passed'] else '  FAIL'}"
            )
        return 0 if all(r["passed"] for r in rows) else 1
    ctx = jax.enable_x64(True) if args.dtype == "float64" else contextlib.nullcontext()
    with ctx:
        cfg = tiny_config(args.variant, args.dtype)
        head, model = make_pair(cfg, args.seed)
        model.eval()
        head.eval()
        batch = make_batch(cfg, args.seed)
        if args.dtype == "float64":
            rows = one_step_comparisons(head, model, batch, FLOAT64, jit=args.jit)
            table = format_table(rows)
        else:
            # float32/bf16: torch's own round-off through the recursion is as large as a direct
            # bound would be; both are judged against torch in float64 (parity.compare.ReferenceBound)
            bound = REFERENCE_BOUNDS[args.dtype]
            rows = reference_comparisons(head, model, batch, bound, jit=args.jit)
            table = format_reference_table(rows)
    print(
        f"TRM parity, variant={args.variant} dtype={args.dtype} {'jitted' if args.jit else 'eager'}:"
        " one ACT step, torch reference vs NNX port"
    )
    print(table)
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
