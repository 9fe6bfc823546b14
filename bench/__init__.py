"""Benchmarks: the JAX train steps against the PyTorch references (docs/benchmarks.md).

python -m bench            step time, throughput, MFU, memory, compile time (JSON + PNG)
python -m bench ttq        wall time to a quality target (time to quality)
"""
