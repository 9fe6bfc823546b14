"""The import structure: no module of the project imports itself back, and train/ outside the
family packages names no model family.

Every module under models/, train/, data/, parity/, launch/ and bench/ is parsed with `ast` (no
project import runs) and each `import` / `from ... import` statement, at module level or inside a
function, becomes an edge to the project module it loads. A cycle is a strongly connected
component of that graph with more than one module (or a module importing itself); the failure
message prints one closed path through each. Function-level imports count too: they only move a
cycle from import time to the first call, where it still makes the two modules one unit.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("models", "train", "data", "parity", "launch", "bench")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {
        _module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if "results" not in p.relative_to(ROOT).parts
    }


def _resolve(name: str, modules) -> str | None:
    """The longest prefix of dotted `name` that is a project module (None: not ours)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _imports(module: str, path: pathlib.Path, modules) -> set[str]:
    """Project modules that `module` imports anywhere in its body (module or function level)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package that holds `module`
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # `from pkg import sub` loads pkg.sub when it is a module, else a name of pkg
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                out.add(resolved)
            elif resolved == module and target == module:
                out.add(module)  # a module that imports itself by name
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is a few hundred modules)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def _a_cycle(graph, component: list[str]) -> list[str]:
    """A shortest closed path through the component's first module (breadth-first)."""
    members, start = set(component), component[0]
    parent, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start] * 2
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def import_cycles() -> list[list[str]]:
    graph = import_graph()
    return [
        _a_cycle(graph, c) for c in _strongly_connected(graph) if len(c) > 1 or c[0] in graph[c[0]]
    ]


def test_the_graph_sees_module_and_function_level_imports():
    """The parser finds what the cycle test relies on (else that test could never fail)."""
    graph = import_graph()
    assert "train.jit" in graph["train.trainer"]  # module level
    assert "models.trm.losses" in graph["bench.ttq"]  # inside a function of bench/ttq.py
    assert _strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"], ["c"]]
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    cycles = import_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# train/ is generic: outside the family packages (train/families/<family>/) no module imports a
# family's model (a package under models/), a data builder or source (data/), or a torch reference
# (parity/), and none compares a value with a family's name. What differs per family reaches the
# commands through the Task contract (train/task.py) and the registry (train/families/__init__.py).
def _family_packages() -> tuple[str, ...]:
    """The packages that hold one family each: models/<family>/ and train/families/<family>/."""
    return tuple(
        f"{root.replace('/', '.')}.{d.name}"
        for root in ("models", "train/families")
        for d in sorted((ROOT / root).iterdir())
        if d.is_dir() and (d / "__init__.py").exists()
    )


def _family_names() -> set[str]:
    """The names a config's `family:` takes (train/families/__init__.py's FAMILIES, read with ast)."""
    tree = ast.parse((ROOT / "train" / "families" / "__init__.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign) and "FAMILIES" in ast.unparse(node):
            return {k.value for k in node.value.keys}
    raise AssertionError("train/families/__init__.py defines no FAMILIES")


# Torch-free modules the parity toolkit owns and the project shares with it (the toolkit runs in
# users' projects, so it may import nothing of ours; what both need lives in the toolkit): not a
# family's code, and checked to import neither torch nor the project below.
SHARED_TOOLKIT = ("parity.files", "parity.state_dict")


def family_leaks(module: str, source: str, imports: set[str], names: set[str]) -> list[str]:
    """What makes `module` (its `source` and its project `imports`) not generic."""
    own = ("train.families.", "models.", "data.", "parity.")
    family_code = ("data", "parity", *(p for p in _family_packages() if p.startswith("models.")))
    leaks = [
        f"imports {t}"
        for t in sorted(imports)
        if (t not in SHARED_TOOLKIT and any(t == f or t.startswith(f + ".") for f in family_code))
        or (t.startswith("train.families.") and not module.startswith(own))
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                values = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]  # fmt: skip
                leaks += [
                    f"line {node.lineno} compares with {v.value!r}"
                    for v in values
                    if isinstance(v, ast.Constant) and v.value in names
                ]
        elif isinstance(node, ast.Dict) and module != "train.families":  # the registry's FAMILIES
            leaks += [
                f"line {node.lineno} keys a dict by {k.value!r}"
                for k in node.keys
                if isinstance(k, ast.Constant) and k.value in names
            ]
    return leaks


def _generic_modules() -> dict[str, pathlib.Path]:
    family = tuple(p for p in _family_packages() if p.startswith("train."))
    return {
        m: p
        for m, p in _modules().items()
        if m.startswith("train") and not any(m == f or m.startswith(f + ".") for f in family)
    }


def test_train_is_generic():
    graph, names = import_graph(), _family_names()
    # FAMILIES lists this repository's families; more may register (entry points) without a line
    assert {"gpt", "trm"} <= names and "train.families.trm" in _family_packages()
    leaks = {
        m: found
        for m, path in _generic_modules().items()
        if (found := family_leaks(m, path.read_text(encoding="utf-8"), graph[m], names))
    }
    assert not leaks, leaks


def test_the_generic_check_can_fail():
    """family_leaks finds each kind of leak in a module outside the family packages."""
    names = {"gpt", "trm"}
    source = 'if cfg.family == "gpt":\n    pass\nok = task in ("trm",)\nf = {"gpt": 1}[task]\n'
    imports = {"models.trm.modeling", "data.puzzle_source", "parity.trm_torch", "models.attention"}
    imports |= {"train.families.trm.task", "train.families"}
    leaks = family_leaks("train.evaluate", source, imports, names)
    assert leaks == [
        "imports data.puzzle_source",
        "imports models.trm.modeling",
        "imports parity.trm_torch",
        "imports train.families.trm.task",
        "line 1 compares with 'gpt'",
        "line 3 compares with 'trm'",
        "line 4 keys a dict by 'gpt'",
    ], leaks
    assert "train.evaluate" in _generic_modules() and "train.families" in _generic_modules()
    assert "train.families.gpt.task" not in _generic_modules()


def test_the_shared_toolkit_modules_import_no_torch_and_nothing_of_the_project():
    """Nothing of the project at any level; torch only inside a function (parity.files reads a
    .pt file with it), so importing them never loads torch."""
    for name in SHARED_TOOLKIT:
        path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported, top = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = {node.module.split(".")[0]}
            else:
                continue
            imported |= names
            if node in tree.body:
                top |= names
        assert not imported & {"models", "train", "data"}, (name, imported)
        assert "torch" not in top, (name, top)


# --- one step, frame by frame ---------------------------------------------------------------------
# The project's frames from `python -m train.main` down to the model's __call__ while the first
# TRM step is traced (docs/architecture.md, "One step, frame by frame"). In the steady state the
# loop's frames are the first three: the step is the compiled program.
ONE_STEP = [
    ("train/main.py", "main"),
    ("train/trainer.py", "train"),
    ("train/trainer.py", "_loop"),
    ("train/nonfinite.py", "train_step"),  # the jitted function: the non-finite guard
    ("models/trm/training.py", "train_step"),  # the family's one step: (state, batch) -> metrics
    ("models/trm/training.py", "train_batch"),  # upstream's train_batch + EMA update
    ("models/trm/training.py", "loss_fn"),  # under jax.grad
    ("models/trm/modeling.py", "__call__"),
]


def test_one_trm_step_is_eight_frames_of_project_code(tmp_path, monkeypatch):
    """`python -m train.main` (in process) on a tiny TRM run: the stack at the model's first call
    holds exactly the ONE_STEP frames of this project (JAX's own frames between them are not
    counted), so a new wrapper, forwarder or layer of indirection fails here and in the doc."""
    import traceback

    from models.trm.modeling import TRM
    from tests.helpers import build_tiny_sudoku, tiny_trm_overrides
    from train.main import main

    stacks = []
    call = TRM.__call__

    def recording(self, *args, **kwargs):
        if not stacks:
            stacks.append(traceback.extract_stack()[:-1])
        return call(self, *args, **kwargs)

    monkeypatch.setattr(TRM, "__call__", recording)
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    main([
        *tiny_trm_overrides(data, str(tmp_path / "runs"), "frames", epochs=1),
        "trainer.max_steps=1",
        "checkpoint.enabled=false",
    ])  # fmt: skip
    ours = [
        (path.relative_to(ROOT).as_posix(), f.name)
        for f in stacks[0]
        if (path := pathlib.Path(f.filename)).is_absolute()
        and any(path.is_relative_to(ROOT / package) for package in PACKAGES)
    ]
    ours.append(("models/trm/modeling.py", "__call__"))  # the recorded call itself
    assert ours == ONE_STEP, "\n".join(f"{p}:{n}" for p, n in ours)


# --- models/ stands alone -------------------------------------------------------------------------
# What models/ may import besides itself and the standard library: the JAX stack.
MODELS_MAY_IMPORT = {"jax", "flax", "optax", "numpy", "einops"}


def test_models_stand_alone():
    """Every import statement under models/, at any level, read with ast: the standard library,
    the JAX stack and models/ itself, nothing else (no torch, safetensors, parity, train, data), so
    `models/<family>/` copies out of the repository alone (docs/architecture.md)."""
    import sys

    bad = []
    for path in sorted((ROOT / "models").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if (
                    top
                    not in {"models", "__future__"} | MODELS_MAY_IMPORT | sys.stdlib_module_names
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not bad, "\n".join(bad)


def test_no_cycle_between_top_level_packages():
    """The packages import one another in one direction only: models/ and data/ import none of
    the others, parity/ the two of them, train/ those three, launch/ and bench/ on top."""
    layers = {"models": 0, "data": 0, "parity": 1, "train": 2, "launch": 3, "bench": 3}
    upward = sorted(
        f"{m} imports {t}"
        for m, targets in import_graph().items()
        for t in targets
        if (a := m.split(".")[0]) != (b := t.split(".")[0]) and layers[b] >= layers[a]
    )
    assert not upward, upward
