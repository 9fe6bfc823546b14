"""python -m parity.goldens --trm-src DIR --adam-atan2-src DIR --nanogpt-src DIR --out DIR

Runs the real upstream code from the given checkouts on the CPU and writes the golden fixtures
(see parity/goldens/__init__.py). Either source may be left out to regenerate only the other;
the TRM training goldens (OUT/trm_train, parity/goldens/trm_train.py) are written when both
--trm-src and --adam-atan2-src are given."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m parity.goldens", description=__doc__.splitlines()[2]
    )
    p.add_argument(
        "--trm-src", type=Path, help="checkout of SamsungSAILMontreal/TinyRecursiveModels"
    )
    p.add_argument(
        "--adam-atan2-src", type=Path, help="checkout of imoneoi/adam-atan2 (TRM training goldens)"
    )
    p.add_argument("--nanogpt-src", type=Path, help="checkout of karpathy/nanoGPT")
    p.add_argument("--out", type=Path, default=Path("tests/goldens"), help="fixture directory")
    args = p.parse_args(argv)
    if args.trm_src is None and args.nanogpt_src is None:
        p.error("give --trm-src and/or --nanogpt-src")
    if args.adam_atan2_src is not None and args.trm_src is None:
        p.error("--adam-atan2-src needs --trm-src (the TRM training goldens run both)")
    for flag, src in (
        ("--trm-src", args.trm_src),
        ("--adam-atan2-src", args.adam_atan2_src),
        ("--nanogpt-src", args.nanogpt_src),
    ):
        if src is not None and not src.is_dir():
            p.error(f"{flag} {src}: not a directory")
    if args.nanogpt_src is not None:
        from parity.goldens import nanogpt

        nanogpt.generate(args.nanogpt_src, args.out / "nanogpt")
    if args.trm_src is not None:
        from parity.goldens import trm

        trm.generate(args.trm_src, args.out / "trm")
    if args.adam_atan2_src is not None:
        from parity.goldens import trm_train

        trm_train.generate(args.trm_src, args.adam_atan2_src, args.out / "trm_train")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
