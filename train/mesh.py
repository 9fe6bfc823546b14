"""The device mesh, logical-axis rules, and the shardings of params, batches and a carry.

One mesh with three named axes for every run: `data` (pure data parallel), `fsdp` (data parallel
whose params/optimizer state may be split, ZeRO-3 style) and `tensor` (model parallel; 1 for the
small models here). Axis types are set EXPLICITLY to Auto: since JAX 0.9 `jax.make_mesh` defaults to
Explicit, under which every matmul needs an `out_sharding` and Flax's logical-rule style raises
sharding type errors (docs/training.md, "traps"). Auto lets GSPMD propagate shardings from the
jit's in/out shardings, which is what MaxText ships (`shard_mode: auto`).
"""

from __future__ import annotations

import math

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from train.errors import ConfigError

AXES = ("data", "fsdp", "tensor")


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
    """Resolves the -1 entry of (data, fsdp, tensor) so the product is `num_devices`."""
    sizes = [int(mesh_cfg.data), int(mesh_cfg.fsdp), int(mesh_cfg.tensor)]
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ConfigError(
                f"mesh (data, fsdp, tensor) = {tuple(sizes)}: {num_devices} visible devices are "
                f"not divisible by {known}"
            )
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ConfigError(
            f"mesh (data, fsdp, tensor) = {tuple(sizes)} needs {math.prod(sizes)} devices, "
            f"but {num_devices} are visible (set mesh=cpu or fix the degrees)"
        )
    return tuple(sizes)


def make_mesh(mesh_cfg, devices=None) -> Mesh:
    """Builds the (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes)."""
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape(mesh_cfg, len(devices))
    axis_type = AxisType.Auto if mesh_cfg.axis_types == "auto" else AxisType.Explicit
    # jax.make_mesh orders devices for the physical topology (ICI rings on TPU) and, across
    # processes, keeps each process's devices contiguous along the leading axes.
    return jax.make_mesh(shape, AXES, axis_types=(axis_type,) * 3, devices=devices)


def _batch_axes(rules) -> tuple[str, ...]:
    axes = logical_to_mesh(rules, "batch")
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def batch_shards(mesh: Mesh, rules) -> int:
    """How many shards the batch axis is split into (the devices of the `batch` rule's axes)."""
    return math.prod(mesh.shape[a] for a in _batch_axes(rules))


def check_batch_divisible(mesh: Mesh, rules, batches: dict[str, int]) -> None:
    """ConfigError unless every batch size (config key -> value) divides evenly over the mesh
    axes of the `batch` rule (else JAX fails at the first step with a sharding error)."""
    axes, n = _batch_axes(rules), batch_shards(mesh, rules)
    for key, size in batches.items():
        if size and size % n:
            shape = ", ".join(f"{a}={mesh.shape[a]}" for a in mesh.axis_names)
            raise ConfigError(
                f"{key}={size} is not divisible by the {n} devices of the batch axes "
                f"{list(axes)} (mesh {shape}); use a multiple of {n} or change mesh.data / "
                "mesh.fsdp"
            )


def logical_to_mesh(rules, name: str | None):
    """The mesh axes a logical axis name maps to (first matching rule), or None (replicated)."""
    if name is None:
        return None
    for logical, physical in rules:
        if logical == name:
            if physical is None or isinstance(physical, str):
                return physical
            return tuple(physical)
    return None


def batch_spec(rules, ndim: int) -> PartitionSpec:
    """Leading (batch) axis over the `batch` rule's mesh axes, the rest replicated."""
    return PartitionSpec(logical_to_mesh(rules, "batch"), *([None] * (ndim - 1)))


def param_spec(shape, mesh: Mesh, mode: str) -> PartitionSpec:
    """FSDP: split the largest dimension that `fsdp` divides; else (or if none divides) replicate.

    Picking the dimension by size rather than by a per-layer annotation keeps the rule independent
    of the model code (both ports here are small); anything unevenly divisible stays replicated,
    which is always correct, just less memory-efficient.
    """
    n = mesh.shape["fsdp"]
    if mode != "fsdp" or n == 1 or len(shape) == 0:
        return PartitionSpec()
    order = sorted(range(len(shape)), key=lambda i: -shape[i])
    for i in order:
        if shape[i] % n == 0 and shape[i] >= n:
            spec = [None] * len(shape)
            spec[i] = "fsdp"
            return PartitionSpec(*spec)
    return PartitionSpec()


def tree_shardings(abstract_tree, mesh: Mesh, mode: str):
    """NamedShardings for a pytree of params / optimizer state (see `param_spec`)."""
    return jax.tree.map(
        lambda x: NamedSharding(mesh, param_spec(x.shape, mesh, mode)), abstract_tree
    )


def carry_shardings(abstract_carry, mesh: Mesh, rules, batch_size: int):
    """Every carry leaf with a leading batch dimension shards like the batch; others replicate."""

    def one(x):
        if x.ndim >= 1 and x.shape[0] == batch_size:
            return NamedSharding(mesh, batch_spec(rules, x.ndim))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, abstract_carry)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
