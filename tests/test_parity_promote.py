"""`python -m parity diff` on modules as transformer code writes them, without transformers: a
reference that casts to float32 inside (parity/promote.py runs those casts in float64 in a float64
run), keyword and nested inputs built in the run's dtype, and a run that fails, named in one line
with its own exit status. The same on transformers' own layers: tests/test_parity_llama.py and
tests/test_parity_zoo.py (slow).
"""

from __future__ import annotations

import collections
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity import diff as diff_cli  # noqa: E402
from parity.check import format_report  # noqa: E402
from parity.diff import RunError, diff  # noqa: E402
from parity.keymap import load_torch, param_dtype  # noqa: E402
from parity.promote import Casts, promoted_casts  # noqa: E402

DIM = 6


class Float32Norm(torch.nn.Module):
    """An RMSNorm as transformers writes it: the statistics in float32 whatever the input."""

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * h.to(x.dtype)


class Scorer(torch.nn.Module):
    """A projection, a float32 norm, a float32 softmax, a float32 position table, and keyword
    inputs nested in a dict and a list."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(DIM, DIM)
        self.norm = Float32Norm(DIM)

    def forward(self, x, *, extras, scale=True):
        h = self.norm(self.proj(x))
        positions = torch.arange(DIM, dtype=torch.float) / 7
        w = torch.nn.functional.softmax(h + positions, dim=-1, dtype=torch.float32).to(x.dtype)
        first, second = extras["tables"]
        out = (w @ first) * second + extras["bias"]  # a matmul: both sides of it in one dtype
        return out if scale else -out


FACTORY_DTYPES = []


def torch_scorer(dtype=torch.float32):
    """TORCH_FACTORY with keyword inputs: tables built in the run's dtype, x in float32 (cast
    by the diff)."""
    FACTORY_DTYPES.append(dtype)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, DIM, generator=g)
    tables = [torch.randn(DIM, DIM, generator=g, dtype=dtype) for _ in range(2)][:1]
    tables.append(torch.randn(3, DIM, generator=g))  # float32 even in another run: cast
    bias = torch.tensor(0.5, dtype=dtype)
    return Scorer(), (x,), {"extras": {"tables": tables, "bias": bias}, "scale": False}


def at_least_float32(x):
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


class NNXFloat32Norm(nnx.Module):
    def __init__(self, dim, *, as_written=False, param_dtype):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.as_written = as_written

    def __call__(self, x):
        h = x.astype(jnp.float32) if self.as_written else at_least_float32(x)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + 1e-5)
        return self.weight[...] * h.astype(x.dtype)


class NNXScorer(nnx.Module):
    def __init__(self, *, as_written=False, param_dtype, rngs):
        self.proj = nnx.Linear(DIM, DIM, param_dtype=param_dtype, rngs=rngs)
        self.norm = NNXFloat32Norm(DIM, as_written=as_written, param_dtype=param_dtype)

    def __call__(self, x, *, extras, scale=True):
        h = self.norm(self.proj(x))
        positions = jnp.arange(DIM, dtype=at_least_float32(x).dtype) / 7
        w = jax.nn.softmax(at_least_float32(h + positions), axis=-1).astype(x.dtype)
        first, second = extras["tables"]
        out = (w @ first) * second + extras["bias"]
        return out if scale else -out


def nnx_scorer(torch_module):
    port = NNXScorer(param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0))
    return load_torch(port, torch_module)


def nnx_scorer_float32_norm(torch_module):
    """The port's norm casts to float32 as written: right in float32, float32-accurate in a
    float64 run."""
    port = NNXScorer(as_written=True, param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0))
    return load_torch(port, torch_module)


# ------------------------------------------------------------------------------ promoted casts


def test_promoted_casts_run_every_float32_cast_in_float64():
    x = torch.randn(2, 3, dtype=torch.float64)
    ids = torch.arange(3)
    with promoted_casts() as casts:
        made = [
            x.float(), x.to(torch.float32), x.to(dtype=torch.float32), x.to("cpu", torch.float32),
            x.type(torch.float32), x.type("torch.FloatTensor"), ids.float(),
            torch.arange(0, 4, 2, dtype=torch.float), torch.zeros(2, dtype=torch.float32),
            x.new_zeros(2, dtype=torch.float32), torch.ones_like(x, dtype=torch.float32),
            torch.tensor(0.1, dtype=torch.float32),
            torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32),
        ]  # fmt: skip
    assert [t.dtype for t in made] == [torch.float64] * len(made)
    assert casts.total == len(made) and casts.by_module == {"": len(made)}
    assert made[-2].item() == 0.1  # the float64 literal, not float32's 0.10000000149
    with promoted_casts(keep=True) as kept:
        assert x.float().dtype == torch.float32 and torch.arange(2.0).dtype == torch.float32
    assert kept.total == 1 and not kept.promoted


def test_random_draws_bit_views_and_autocast_are_left_as_they_are():
    """A sampler's dtype chooses its numbers: the float64 run draws the float32 run's numbers.
    `view(dtype)` reinterprets bits. Autocast never casts a float64 tensor."""
    g = torch.Generator()
    plain = torch.randn(4, dtype=torch.float32, generator=g.manual_seed(0))
    bits = torch.arange(4, dtype=torch.int32)
    x = torch.randn(3, 3, dtype=torch.float64)
    with promoted_casts() as casts:
        drawn = torch.randn(4, dtype=torch.float32, generator=g.manual_seed(0))
        viewed = bits.view(torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            product = x @ x
    assert drawn.dtype == torch.float32 and torch.equal(drawn, plain)
    assert viewed.dtype == torch.float32 and casts.total == 0
    assert product.dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the control: float32 is cast
        assert (x.float() @ x.float()).dtype == torch.bfloat16


def test_casts_are_counted_by_module():
    torch.manual_seed(0)
    module = Scorer().double()
    x = torch.randn(3, DIM, dtype=torch.float64)
    tables = [torch.eye(DIM, dtype=torch.float64), torch.ones(3, DIM, dtype=torch.float64)]
    extras = {"tables": tables, "bias": torch.tensor(0.0)}
    with promoted_casts(module, outside="factory") as casts:
        torch.zeros(1, dtype=torch.float32)
        module(x, extras=extras)
    # the norm's .to(float32); the root's arange and softmax; the factory's zeros
    assert dict(casts.by_module) == {"factory": 1, "norm": 1, "": 2}
    assert casts.where() == "factory 1, norm 1, (root) 2"
    many = Casts(collections.Counter({f"layers.{i}.norm": 1 for i in range(12)}))
    assert many.where().endswith("layers.11.norm 1")  # every module: the note is never cut


# ------------------------------------------------------------------------------------ the diff


def test_float64_diff_promotes_the_references_casts_and_says_so():
    report = diff(torch_scorer, nnx_scorer, dtype="float64", grads=True)
    assert report.passed, format_report(report)
    # the norm's .to(float32); the root's arange and softmax (the factory builds in float64)
    note = "3 casts to float32 in torch ran in float64 (--keep-casts: as written): norm 1, (root) 2"
    assert note in report.notes, report.notes
    kept = diff(torch_scorer, nnx_scorer, dtype="float64", keep_casts=True)
    module, row = kept.first_divergent()
    assert module == "norm" and row.inputs_agree, format_report(kept)
    assert "--keep-casts: 3 casts to float32 in torch ran in float32" in "\n".join(kept.notes)


def test_a_port_that_casts_to_float32_as_written_is_named_in_float64():
    assert diff(torch_scorer, nnx_scorer_float32_norm, dtype="float32").passed
    report = diff(torch_scorer, nnx_scorer_float32_norm, dtype="float64")
    module, row = report.first_divergent()
    assert module == "norm" and row.inputs_agree, format_report(report)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_keyword_and_nested_inputs_in_the_runs_dtype(dtype, jit):
    """The factory gets the run's dtype; every floating tensor of the nested keyword inputs is
    cast (a float32 table in a bfloat16 run would fail torch's matmul); the port gets the same
    structure, its flag a constant under jit."""
    FACTORY_DTYPES.clear()
    report = diff(torch_scorer, nnx_scorer, dtype=dtype, grads=True, jit=jit)
    assert FACTORY_DTYPES == [getattr(torch, dtype)]
    assert report.passed, format_report(report)
    root = next(r for r in report.section("outputs") if r.module == "")
    assert root.inputs_agree is True, format_report(report)  # x, bias, both tables: 4 leaves


# ------------------------------------------------------------------------------- failed runs


class Raises(torch.nn.Module):
    def forward(self, x):
        raise ValueError("no such shape\nsecond line of the message")


class WithABrokenChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.inner = Raises()

    def forward(self, x):
        return self.inner(self.fc(x))


def torch_broken():
    return WithABrokenChild(), (torch.ones(1, 2),)


def torch_fine():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2), (torch.ones(1, 2),)


def torch_factory_raises():
    raise KeyError("config")


class NNXBrokenLinear(nnx.Linear):
    def __call__(self, x):
        return x @ jnp.ones((3, 3))  # a shape error inside the port's module


class NNXWithAChild(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(2, 2, rngs=rngs)

    def __call__(self, x):
        return self.fc(x)


def nnx_with_a_child(torch_module):
    return load_torch(NNXWithAChild(nnx.Rngs(0)), torch_module)


def nnx_broken(torch_module):
    return load_torch(NNXBrokenLinear(2, 2, rngs=nnx.Rngs(0)), torch_module)


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["tests.test_parity_promote:torch_broken", "tests.test_parity_promote:nnx_with_a_child"],
            "the torch run failed in inner: ValueError: no such shape ...",
        ),
        (
            ["tests.test_parity_promote:torch_factory_raises", "tests.test_parity_mlp:nnx_mlp"],
            "the torch run failed in TORCH_FACTORY tests.test_parity_promote:torch_factory_raises: KeyError: 'config'",
        ),
        (
            ["tests.test_parity_promote:torch_fine", "tests.test_parity_promote:nnx_broken"],
            "the JAX run failed in (root): TypeError: dot_general requires contracting dimensions to have the same shape",
        ),
    ],
    ids=["torch-module", "torch-factory", "jax-module"],
)  # fmt: skip
def test_a_failed_run_is_one_line_with_exit_status_3(args, expected, capsys):
    assert diff_cli.main(args) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_a_failed_run_raises_run_error_naming_the_side_and_module():
    with pytest.raises(RunError) as info:
        diff(torch_broken, nnx_with_a_child)
    assert (info.value.side, info.value.where) == ("torch", "inner")
    assert isinstance(info.value.error, ValueError)


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as info:
        diff_cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for code in ("0  every compared tensor agrees", "1  a tensor differs", "2  bad arguments"):
        assert code in out, out
    assert "3  the run itself failed" in out and "--keep-casts" in out, out


def test_the_nested_structure_reaches_the_port_as_jax_arrays():
    from parity.diff import _to_jax

    tree = ({"a": [torch.ones(2), (torch.zeros(1, dtype=torch.int64), None)]}, True)
    got = _to_jax(tree)
    assert isinstance(got, tuple) and isinstance(got[0]["a"], list) and got[1] is True
    assert isinstance(got[0]["a"][0], jax.Array) and got[0]["a"][1][1] is None
    np.testing.assert_array_equal(got[0]["a"][1][0], np.zeros(1))


def test_a_factory_module_whose_import_is_missing_names_what_to_install(tmp_path):
    """A factory module that imports a package this environment lacks (pytest in a venv without
    the dev extra, say): one line naming the package and the install, exit status 2."""
    (tmp_path / "my_factories.py").write_text(
        "import no_such_package_xyz\n\ndef torch_side():\n    pass\n\ndef nnx_side():\n    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "parity", "diff", "my_factories:torch_side", "my_factories:nnx_side"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines == [
        "python -m parity diff: TORCH_FACTORY 'my_factories:torch_side': 'my_factories' imports "
        "'no_such_package_xyz', which this environment lacks: pip install no_such_package_xyz"
    ], lines
    from parity.diff import _EXTRAS

    assert _EXTRAS["pytest"] == "pip install -e '.[dev]'"  # the extra the tests' factories need


def test_a_hint_names_this_repositorys_extras_only_for_its_own_factories(tmp_path):
    """A user's factory module whose `import transformers` fails gets the pip line alone; the
    repository's extras (`pip install -e '.[zoo]'`) mean something only for its own tests."""
    from parity.diff import _in_this_repository

    (tmp_path / "my_factories.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'transformers'\", name='transformers')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "parity", "diff", "my_factories:torch_side", "my_factories:nnx_side"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].endswith("which this environment lacks: pip install transformers"), lines
    assert _in_this_repository("tests.test_parity_mlp")
    assert not _in_this_repository("json") and not _in_this_repository("no_such_module_xyz")
