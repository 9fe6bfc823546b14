"""Config dataclass fields with the range of values that make sense, stated once, in the field's
metadata:

    hidden_size: int = ranged(512, ">0")

The dataclass checks it when built (`check_ranges(self)` in `__post_init__`: ValueError naming the
class and field), and the trainer checks the composed config against the same metadata before
anything is built (train.config.check_ranges: ConfigError naming the dotted key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# rule -> (test, how a message says it)
RULES = {
    ">0": (lambda v: v > 0, "> 0"),
    ">=0": (lambda v: v >= 0, ">= 0"),
    "[0,1)": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "[0,1]": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}


def ranged(default, rule: str):
    """A dataclass field with `default` whose values must satisfy `rule` (one of RULES)."""
    if rule not in RULES:
        raise ValueError(f"range rule {rule!r}: expected one of {sorted(RULES)}")
    return dataclasses.field(default=default, metadata={"range": rule})


def ranges(cls) -> dict[str, str]:
    """field name -> its range rule, for the fields of dataclass `cls` that have one."""
    return {f.name: f.metadata["range"] for f in dataclasses.fields(cls) if "range" in f.metadata}


def out_of_range(values: Mapping, cls) -> tuple[str, str, object] | None:
    """(field, "must be ..." text, value) of the first value of `values` outside its field's
    range; None when all are in range. Absent, non-numeric and boolean values are not checked."""
    for name, rule in ranges(cls).items():
        value = values.get(name)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        ok, text = RULES[rule]
        if not ok(value):
            return name, text, value
    return None


def check_ranges(obj) -> None:
    """ValueError naming the first field of the dataclass instance `obj` outside its range."""
    bad = out_of_range({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, type(obj))
    if bad is not None:
        name, text, value = bad
        raise ValueError(f"{type(obj).__name__}.{name} must be {text}, got {value!r}")
