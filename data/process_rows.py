"""Which rows of every global batch a JAX process loads: one rule for every loader.

Process p of n takes the p-th of n equal contiguous slices, so the rows the processes pass to
`jax.make_array_from_process_local_data` line up with a batch axis sharded in process order.
"""

from __future__ import annotations


def process_rows(
    global_batch_size: int, process_index: int | None = None, process_count: int | None = None
) -> tuple[int, int]:
    """[start, stop) of this process's rows; index and count default to jax's (tests pass them)."""
    if process_index is None or process_count is None:
        import jax  # only the default needs JAX

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} outside [0, {process_count})")
    if global_batch_size % process_count:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by "
            f"process_count={process_count}"
        )
    local = global_batch_size // process_count
    return process_index * local, (process_index + 1) * local
