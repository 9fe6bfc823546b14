"""Compare two captures (parity.capture) module by module and name the first divergent module.

Rows come in four sections, checked in this order, each in the reference's order:

- weights: every state_dict tensor against the port's variable in torch layout (EXACT: a copy);
- outputs: every module call, in the order the calls returned (children before their parent);
- state: every buffer after the call (BatchNorm running statistics in train mode);
- grads: the gradient of every parameter under the seeded cotangent loss.

The first failing row names the module to look at. For an output row, a module whose own inputs
already differ did not cause the difference: the divergence entered in the code of an enclosing
module before this call, so the name moves up to the nearest enclosing call whose inputs agree.
Inputs are compared only where both sides pass the same tensors (same count and shapes).

A port's tensor must have torch's shape, unless the rule of the module's class declares
another layout for its activations (parity/keymap.py: `register_rule(..., layout=...)`;
flax's convolutions and norms channels-last, attention heads on their own axis): then a tensor
in that layout is compared in torch's (a permutation or a reshape), and a note names the calls
and the rule. Any other shape fails the row, naming both shapes: a port that returns its
output transposed, or its attention weights in another axis order, fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from parity.capture import Call, Capture
from parity.compare import EXACT, Comparison, Tolerance, compare
from parity.keymap import ActivationLayout

ROOT = "(root)"  # how the model itself ("" in torch's named_modules) is printed
SECTIONS = ("weights", "outputs", "state", "grads", "steps")


@dataclasses.dataclass
class Row:
    """One compared unit: a module call, a state tensor or a gradient.

    `passed` is None when the port has nothing to compare (a torch module the port computes
    inline, e.g. an activation function); such a row never fails the check."""

    section: str
    label: str
    module: str
    passed: bool | None
    comparison: Comparison | None = None
    tensor: str = ""
    inputs_agree: bool | None = None
    note: str = ""


@dataclasses.dataclass
class Report:
    rows: list[Row]
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed is not False for r in self.rows)

    def section(self, name: str) -> list[Row]:
        return [r for r in self.rows if r.section == name]

    def first_divergent(self) -> tuple[str, Row] | None:
        """(module path, the row that shows it) or None when every row agrees."""
        for i, row in enumerate(self.rows):
            if row.passed is not False:
                continue
            if row.section == "outputs" and row.inputs_agree is False:
                return _enclosing(self.rows, i), row
            return row.module, row
        return None


def module_name(path: str) -> str:
    return path if path else ROOT


def _is_ancestor(outer: str, inner: str) -> bool:
    return outer == "" or inner.startswith(outer + ".")


def _enclosing(rows: list[Row], i: int) -> str:
    """The nearest call after row i (calls are listed as they return) of a module enclosing
    row i's, whose inputs do not already differ."""
    inner = rows[i].module
    for row in rows[i + 1 :]:
        if row.section != "outputs" or not _is_ancestor(row.module, inner):
            continue
        if row.module == inner:
            continue
        if row.inputs_agree is not False:
            return row.module
        inner = row.module
    return ""


# ----------------------------------------------------------------------------------- tensors


def _ratio(c: Comparison) -> float:
    """How much of its bound a comparison used (1.0 = at the bound)."""
    if not np.isfinite(c.max_abs):
        return float("inf")
    bound = c.tolerance.rtol * (abs(c.expected_at_worst) + c.scale)
    if c.tolerance.atol is not None:
        bound = c.tolerance.rtol * abs(c.expected_at_worst) + c.tolerance.atol
    return c.max_abs / bound if bound > 0 else (0.0 if c.max_abs == 0 else float("inf"))


def _dtype(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def _shape(x) -> tuple:
    return tuple(int(n) for n in np.shape(x))


def compare_leaves(
    what: str,
    port: Sequence,
    reference: Sequence,
    tol: Tolerance,
    *,
    dtypes: bool = False,
    layout: ActivationLayout | None = None,
) -> tuple[bool, Comparison | None, str, str]:
    """Compare two lists of tensors (`what`[i] names each) -> (passed, the worst comparison, its
    tensor name, a note when the lists cannot be compared). `dtypes`: a floating tensor must
    also have torch's dtype (a float32 result in a float64 run fails even where its values are
    float32-exact). `layout`: the layout declared for the module (a tensor in it is compared in
    torch's); without one, every shape must be torch's."""
    if len(port) != len(reference):
        return False, None, "", f"the port gives {len(port)} tensors, torch {len(reference)}"
    worst: tuple[float, Comparison | None, str] = (-1.0, None, "")
    for i, (a, e) in enumerate(zip(port, reference)):
        name = f"{what}[{i}]"
        aligned = in_torch_layout(a, e, layout)
        if aligned is None:
            how = (
                f"not torch's in the declared {layout.name} layout"
                if layout is not None
                else "no layout declared for this module"
            )
            return (
                False,
                None,
                name,
                f"{name}: port shape {_shape(a)}, torch {_shape(e)} ({how})",
            )
        a = aligned
        if dtypes and "float" in _dtype(e) and _dtype(a) != _dtype(e):
            return False, None, name, f"{name}: port dtype {_dtype(a)}, torch {_dtype(e)}"
        c = compare(name, a, e, tol)
        ratio = float("inf") if not c.passed else _ratio(c)
        if ratio > worst[0]:
            worst = (ratio, c, name)
    _, c, name = worst
    return (c is None or c.passed), c, name, ""


def in_torch_layout(port, reference, layout: ActivationLayout | None = None):
    """The port's tensor as torch lays it out: as it is when the shapes agree, through the
    declared `layout` when it is torch's in that layout, else None (the shapes disagree)."""
    if _shape(port) == _shape(reference):
        return port
    if layout is not None:
        return layout.to_torch(port, _shape(reference))
    return None


def _moved(port: Sequence, reference: Sequence, layout: ActivationLayout | None) -> bool:
    """Whether a declared layout converts any of the tensors."""
    return (
        layout is not None
        and len(port) == len(reference)
        and any(
            _shape(a) != _shape(e) and layout.to_torch(a, _shape(e)) is not None
            for a, e in zip(port, reference)
        )
    )


def _same_structure(a: Sequence, b: Sequence, layout: ActivationLayout | None) -> bool:
    return len(a) == len(b) and all(in_torch_layout(x, y, layout) is not None for x, y in zip(a, b))


def _agrees_reread(port: Call, reference: Call, tol: Tolerance, layout) -> bool:
    """Outputs whose shapes are the same in both layouts (channels-last on a map whose channel
    count equals every spatial size) that agree when the port's are read in the declared
    layout: the likely cause of a failing row."""
    if layout is None or layout.reread is None:
        return False
    pairs = list(zip(port.outputs, reference.outputs))
    ambiguous = [
        np.ndim(e) >= 3 and len(set(_shape(e)[1:])) == 1 and _shape(a) == _shape(e)
        for a, e in pairs
    ]
    if len(port.outputs) != len(reference.outputs) or not any(ambiguous):
        return False
    moved = [layout.reread(a) if amb else a for (a, _), amb in zip(pairs, ambiguous)]
    return compare_leaves("out", moved, reference.outputs, tol)[0]


# ------------------------------------------------------------------------------------- calls


def call_labels(calls: Sequence[Call]) -> dict[tuple, str]:
    """`blocks.1.norm`, `(root)`, `cell [2/5]` (the second of five calls), `inner.embed (method)`."""
    totals: dict[tuple, int] = {}
    for c in calls:
        totals[c.path, c.method] = totals.get((c.path, c.method), 0) + 1
    out = {}
    for c in calls:
        label = module_name(c.path) + ("" if c.method == "forward" else f".{c.method}")
        n = totals[c.path, c.method]
        out[c.key] = label + (f" [{c.index + 1}/{n}]" if n > 1 else "")
    return out


Declared = tuple[ActivationLayout, str]  # a layout and the torch class whose rule declares it


def compare_calls(
    port: Sequence[Call],
    reference: Sequence[Call],
    tolerance_for: Callable[[tuple], Tolerance],
    *,
    dtypes: bool = False,
    layouts: Mapping[str, Declared] | None = None,
) -> tuple[list[Row], list[str]]:
    """One row per reference call, in its order -> (rows, notes on port calls torch has not, and
    on the calls compared through a declared layout). `dtypes`: floating outputs must have
    torch's dtype too (compare_leaves). `layouts`: module path -> the layout declared for it
    (parity.keymap.declared_layouts); any other module's tensors must have torch's shapes."""
    by_key = {c.key: c for c in port}
    labels = call_labels(reference)
    layouts = layouts or {}
    rows: list[Row] = []
    converted: dict[tuple[ActivationLayout, str], list[str]] = {}
    notes: list[str] = []
    for ref in reference:
        mine = by_key.pop(ref.key, None)
        label = labels[ref.key]
        if mine is None:
            rows.append(Row("outputs", label, ref.path, None, note="no port module at this path"))
            continue
        layout, owner = layouts.get(ref.path, (None, ""))
        if _moved(mine.outputs, ref.outputs, layout) or _moved(mine.args, ref.args, layout):
            converted.setdefault((layout, owner), []).append(label)
        tol = tolerance_for(ref.key)
        passed, c, tensor, note = compare_leaves(
            "out", mine.outputs, ref.outputs, tol, dtypes=dtypes, layout=layout
        )
        if not passed and _agrees_reread(mine, ref, tol, layout):
            notes.append(
                f"{label}: its output agrees read as {layout.name}, but C equals every spatial"
                " size, so the shape cannot tell the layouts apart: give the example inputs"
                " distinct channel and spatial sizes"
            )
        inputs = None
        if _same_structure(mine.args, ref.args, layout) and ref.args:
            # an argument may hold the same infinities on both sides (an additive -inf mask)
            masks_ok = dataclasses.replace(tol, nonfinite=True)
            inputs = compare_leaves(
                "in", mine.args, ref.args, masks_ok, dtypes=dtypes, layout=layout
            )[0]
        rows.append(Row("outputs", label, ref.path, passed, c, tensor, inputs, note))
    by_layout: dict[ActivationLayout, dict[str, list[str]]] = {}
    for (layout, owner), moved in converted.items():
        by_layout.setdefault(layout, {})[owner] = moved
    for layout, owners in reversed(by_layout.items()):
        n = sum(map(len, owners.values()))
        rules = "; ".join(f"{owner}: {', '.join(moved)}" for owner, moved in owners.items())
        notes.insert(
            0,
            f"{n} port call{'s' if n > 1 else ''} in the {layout.name} layout {layout.port},"
            f" compared in torch's, declared by the rule of {rules}",
        )
    if by_key:
        extra = call_labels(port)
        names = [extra[k] for k in by_key]
        notes.append(
            f"{len(names)} port calls have no torch counterpart (not compared): " + ", ".join(names)
        )
    return rows, notes


def compare_named(
    section: str,
    port: Mapping[str, object],
    reference: Mapping[str, object],
    tolerance_for: Callable[[str], Tolerance],
    *,
    dtypes: bool = False,
) -> list[Row]:
    """One row per reference key (weights, state or grads), in the reference's order."""
    rows = []
    for key, expected in reference.items():
        module = key.rpartition(".")[0]
        if key not in port:
            rows.append(Row(section, key, module, None, note="not in the port"))
            continue
        passed, c, _, note = compare_leaves(
            key, [port[key]], [expected], tolerance_for(key), dtypes=dtypes
        )
        rows.append(Row(section, key, module, passed, c, "", None, note))
    return rows


# ---------------------------------------------------------------------------------- envelope


def envelope(reference: Capture, perturbed: Sequence[Capture]) -> dict[tuple, float]:
    """Per call key and per gradient key: the largest scale-relative move of its tensors over
    the reference runs whose weights moved by one ulp (parity.envelope.perturbed_copies)."""
    from parity.envelope import largest_moves

    return largest_moves(_moved_tensors(reference), [_moved_tensors(run) for run in perturbed])


def _moved_tensors(run: Capture) -> dict:
    from parity.state_dict import to_numpy

    out: dict = {c.key: [to_numpy(x) for x in c.outputs] for c in run.calls}
    out.update({k: to_numpy(g) for k, g in (run.grads or {}).items()})
    return out


# ----------------------------------------------------------------------------------- printing


def _row_line(r: Row) -> str:
    c = r.comparison
    name = r.label if len(r.label) <= 40 else "..." + r.label[-37:]
    if c is None:
        result = {None: "-", True: "pass", False: "FAIL"}[r.passed]
        return (
            f"{name:<40} {r.tensor:<8} {'':<16} {'':>9} {'':>9} {'':>8} {'':<24}  {result}"
            f"  {r.note}"
        )
    shape = str(c.shape) if len(str(c.shape)) <= 16 else str(c.shape)[:13] + "..."
    bound = c.tolerance.name if len(c.tolerance.name) <= 24 else c.tolerance.name[:21] + "..."
    flag = "pass" if r.passed else "FAIL"
    if r.passed is False and r.inputs_agree is False:
        flag += "  (its inputs already differ)"
    return (
        f"{name:<40} {r.tensor:<8} {shape:<16} {c.max_abs:>9.2e} {c.scale_rel:>9.2e}"
        f" {c.tolerance.rtol:>8.1e} {bound:<24}  {flag}"
    )


def format_rows(rows: Sequence[Row]) -> list[str]:
    head = (
        f"{'module':<40} {'tensor':<8} {'shape':<16} {'max abs':>9} {'rel/scale':>9}"
        f" {'tol':>8} {'bound':<24}  result"
    )
    return [head, "-" * len(head), *(_row_line(r) for r in rows)]


def where(row: Row) -> str:
    """The failing row in one line: the tensor, its errors and where in the tensor."""
    c = row.comparison
    if c is None:
        return f"{module_name(row.module)} ({row.section}): {row.note}"
    inputs = {True: "; its inputs agree", False: "; its inputs already differ", None: ""}
    return (
        f"{row.label} ({row.section}): {row.tensor or c.name} max_abs={c.max_abs:.3e}"
        f" rel/scale={c.scale_rel:.3e} max_rel={c.max_rel:.3e} at index {c.worst_index}:"
        f" port={c.actual_at_worst!r} torch={c.expected_at_worst!r}"
        f" (tol {c.tolerance.name}){inputs[row.inputs_agree]}"
    )


def format_report(report: Report, *, show: Sequence[str] = SECTIONS) -> str:
    """The per-module table: output rows in full, weights / state / grads rows in full when
    asked for in `show` (failing rows always), then a summary and, when something differs, the
    failing row and a last line `first divergent module: <path>`."""
    lines: list[str] = []
    for section in SECTIONS:
        rows = report.section(section)
        if not rows:
            continue
        shown = rows if section in show else [r for r in rows if r.passed is False]
        n_ok = sum(r.passed is True for r in rows)
        n_bad = sum(r.passed is False for r in rows)
        n_na = sum(r.passed is None for r in rows)
        lines.append("")
        lines.append(
            f"{section}: {n_ok} agree, {n_bad} differ"
            + (f", {n_na} not in the port" if n_na else "")
        )
        if shown:
            lines.extend(format_rows(shown))
    lines.extend(f"note: {n}" for n in report.notes)
    found = report.first_divergent()
    if found is None:
        n = sum(r.passed is True for r in report.rows)
        lines.append(f"every compared tensor agrees ({n} rows)")
    else:
        module, row = found
        lines.append(where(row))
        lines.append(f"first divergent module: {module_name(module)}")
    return "\n".join(lines).lstrip("\n")


def exact(_key) -> Tolerance:
    return EXACT
