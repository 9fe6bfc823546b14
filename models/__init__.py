"""Flax NNX ports: `models.gpt` (nanoGPT) and `models.trm` (Tiny Recursive Model and variants).

Nothing in this package imports torch at module level: users who only train in JAX never need it.
"""
