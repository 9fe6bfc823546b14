"""Golden copies produced by the real upstream code (SamsungSAILMontreal/TinyRecursiveModels and
karpathy/nanoGPT), run from checkouts the user points at.

Nothing of upstream lives in this repository: `python -m parity.goldens --trm-src DIR
--nanogpt-src DIR --out DIR` imports upstream from the given paths, runs it on the CPU, and writes
small `.npz` fixtures plus `manifest.json` (upstream commit, torch version, configs, seeds, and
what had to be stood in for because it cannot run on a CPU). The default-tier tests load the
committed fixtures (tests/goldens/) through the port's converters and compare with named bounds.
"""
