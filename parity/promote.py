"""A torch reference's own casts to float32, run in float64.

References written for mixed precision compute some steps in float32 whatever the input's dtype:
transformers' RMSNorm (`hidden_states.to(torch.float32)`), its eager softmax
(`softmax(..., dtype=torch.float32)`), rotary tables (`torch.arange(..., dtype=torch.float)`,
`position_ids.float()`). In a float64 run those steps are float32-accurate, about 1e-7 of scale,
so no port can agree with the reference within FLOAT64, and a port's float64 error (a wrong
epsilon) hides below that. `promoted_casts` runs a block under a torch function mode that rewrites
every cast to float32 into a cast to float64:

- `Tensor.float()`; a `torch.float32` argument, positional or keyword (`.to(torch.float32)`,
  `.to(dtype=...)`, `.type(torch.float32)`, `dtype=` of factories, softmax, `new_*`, `*_like`);
  `.type("torch.FloatTensor")`;
- not random draws (`torch.randn(..., dtype=torch.float32)` draws the float32 run's numbers: the
  dtype of a sampler chooses which numbers it draws) and not `Tensor.view(dtype)`, which
  reinterprets bits.

Autocast needs nothing: torch's autocast never casts a float64 tensor, so a float64 run passes
through autocast blocks unchanged (tests/test_parity_promote.py).

Calls reach the mode through `__torch_function__`: Tensor methods, torch functions and
torch.nn.functional. Code that builds a float32 array outside torch (numpy) is not seen. The
port's side is the port's own code: write a float32 cast as "at least float32",
`x.astype(jnp.promote_types(x.dtype, jnp.float32))`, which is float32 in a float32 or bfloat16 run
as the reference's, and float64 in a float64 run (docs/porting_your_model.md, "transformers'
float32 casts in a float64 run").
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Iterator

# samplers whose dtype decides which numbers they draw: kept as written
_RANDOM = (
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm",
    "normal", "bernoulli", "multinomial", "poisson",
)  # fmt: skip
_FLOAT_TENSOR_TYPES = ("torch.FloatTensor",)  # .type() by name


@dataclasses.dataclass
class Casts:
    """The float32 casts one block made, per module path (torch's dotted path, "" = the module
    itself; `outside` for code outside any module call, e.g. a factory building inputs), and
    whether they were promoted (False: counted only, run as written)."""

    by_module: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    promoted: bool = True

    @property
    def total(self) -> int:
        return sum(self.by_module.values())

    def where(self) -> str:
        """`input_layernorm 1, self_attn 2`: every module, in first-cast order."""
        return ", ".join(f"{m or '(root)'} {n}" for m, n in self.by_module.items())


def _float32_to(to, args: tuple, kwargs: dict):
    """(args, kwargs) with every torch.float32 argument made `to`, or None where there is none."""
    import torch

    changed = False

    def swap(v):
        nonlocal changed
        if v is torch.float32:
            changed = True
            return to
        return v

    args = tuple(swap(a) for a in args)
    kwargs = {k: swap(v) for k, v in kwargs.items()}
    return (args, kwargs) if changed else None


def _rewrite(func, args: tuple, kwargs: dict, to):
    """The call with its cast to float32 made a cast to `to` -> (func, args, kwargs), or None when
    the call casts nothing to float32."""
    import torch

    if func is torch.Tensor.float:
        return torch.Tensor.to, (args[0], to), kwargs
    if func is torch.Tensor.view or func in _random_functions():
        return None
    if func is torch.Tensor.type and len(args) > 1 and args[1] in _FLOAT_TENSOR_TYPES:
        return func, (args[0], to, *args[2:]), kwargs
    found = _float32_to(to, args, kwargs)
    return None if found is None else (func, *found)


@functools.cache
def _random_functions() -> tuple:
    import torch

    return tuple(getattr(torch, n) for n in _RANDOM if hasattr(torch, n))


def _mode_class():
    from torch.overrides import TorchFunctionMode

    class PromoteFloat32(TorchFunctionMode):
        def __init__(self, to, where, casts: Casts):
            super().__init__()
            self.to, self.where, self.casts = to, where, casts

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            rewritten = _rewrite(func, args, kwargs, self.to)
            if rewritten is not None:
                self.casts.by_module[self.where()] += 1
                if self.casts.promoted:
                    func, args, kwargs = rewritten
            return func(*args, **kwargs)

    return PromoteFloat32


@contextlib.contextmanager
def promoted_casts(
    module=None, *, to="float64", keep: bool = False, outside: str = ""
) -> Iterator[Casts]:
    """Run the block with every cast to float32 made a cast to `to` (torch.float64 by default);
    yields the `Casts` it made, per module of `module` (a torch.nn.Module whose submodules name
    where each cast happened; calls outside its forward count under `outside`). `keep`: count the
    casts, run them as written.

        with promoted_casts(layer) as casts:
            out = layer(x64)
        print(casts.summary())
    """
    import torch

    target = getattr(torch, to) if isinstance(to, str) else to
    casts = Casts(promoted=not keep)
    stack: list[str] = []
    handles = []

    def enter(path):
        def hook(_module, _args):
            stack.append(path)

        return hook

    def leave(_module, _args, _output):  # returns None: the output stays as it is
        stack.pop()

    if module is not None:
        for path, m in module.named_modules():
            handles.append(m.register_forward_pre_hook(enter(path)))
            handles.append(m.register_forward_hook(leave, always_call=True))
    try:
        with _mode_class()(target, lambda: stack[-1] if stack else outside, casts):
            yield casts
    finally:
        for h in handles:
            h.remove()
