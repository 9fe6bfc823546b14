"""The peak FLOP/s a benchmark's MFU is divided by (train/flops.py's table and CPU measurement).

GPU: the datasheet figure of the device jax sees. CPU: measured, in a worker process pinned like
the benchmark's workers, so the ceiling is what those cores reach. `--peak-flops` overrides both.
"""

from __future__ import annotations

import multiprocessing as mp


def _peak_worker(conn, device: str, threads: int | None) -> None:
    from bench.worker import prepare_env

    prepare_env("jax", device, threads)
    try:
        import jax

        from bench.machine import cpu_count
        from train.flops import measure_matmul_flops, peak_flops_for

        if device == "gpu":
            name = jax.devices()[0].device_kind
            conn.send(("ok", (peak_flops_for(name), f"preset for {name}")))
        else:
            peak = measure_matmul_flops()
            cores = cpu_count()  # after prepare_env: the cores a worker may use
            src = f"measured: best fp32 1024^3 matmul through XLA on {cores} core(s)"
            conn.send(("ok", (peak, src)))
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", repr(e)))


def resolve_peak_flops(
    device: str, override: float | None, threads: int | None = None
) -> tuple[float | None, str]:
    """-> (peak FLOP/s or None, where it came from)."""
    if override:
        return override, "given by --peak-flops"
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_peak_worker, args=(child, device, threads), daemon=True)
    proc.start()
    status, payload = parent.recv() if parent.poll(300) else ("error", "timeout")
    proc.join(10)
    if status != "ok" or payload[0] is None:
        return None, f"unknown ({payload if status != 'ok' else payload[1]}); pass --peak-flops"
    return payload
