"""The diff's power, measured by mutants (parity/mutate.py): every port of tests/parity_mutants.py
broken on purpose at one module, one row per mutation (output transposed, heads rolled, a bias
not added, an eps x10, two weights exchanged, the other GELU, the causal mask off by one, a
residual dropped, a float32 cast skipped), each run through the diff in the dtype its row names:
every mutant fails and the report names the mutated module, except the findings the tables
write down. Layouts are declared, never inferred: an output transposed or permuted, attention
weights in another axis order and a dropped position fail, with and without gradients, naming
the module and both shapes. The command: `python -m parity mutate SPEC`.
"""

from __future__ import annotations

import subprocess
import sys

import jax.numpy as jnp
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity import mutate  # noqa: E402
from parity.check import format_report  # noqa: E402
from parity.diff import UsageError, diff  # noqa: E402
from parity.keymap import LAYOUTS, load_torch  # noqa: E402
from parity.mutate import KINDS, Mutant, Spec  # noqa: E402
from tests import parity_mutants  # noqa: E402
from tests.helpers import REPO  # noqa: E402

SLOW_SPECS = ("conv", "lstm")  # the default tier keeps the GRU for the recurrent rules


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in SLOW_SPECS else n
        for n in sorted(parity_mutants.SPECS)
    ],
)
def test_every_mutant_is_killed_and_named_at_the_mutated_module(name):
    """Each port passes unmutated in every dtype its table uses; each mutant fails, the first
    divergent module is the one its row names; a row with a written finding survives."""
    result = mutate.run(parity_mutants.SPECS[name]())
    text = mutate.format_result(result)
    assert result.passed, text
    findings = [o for o in result.outcomes if o.mutant.finding]
    assert result.killed == len(result.outcomes) - len(findings), text


LAYOUT_CASES = {
    "transposed": ("gpt_block", Mutant("transpose_output", ""), "port shape (2, 32, 8), torch (2, 8, 32)"),
    "permuted": ("gpt_block", Mutant("permute_axes", "", option=(0, (1, 0, 2))), "port shape (8, 2, 32), torch (2, 8, 32)"),
    "weights (B, T, S, H)": ("mha", Mutant("permute_axes", "", option=(1, (0, 2, 3, 1))), "out[1]: port shape (2, 6, 6, 4), torch (2, 4, 6, 6)"),
    "position dropped": ("gpt_block", Mutant("drop_position", ""), "port shape (2, 7, 32), torch (2, 8, 32)"),
}  # fmt: skip


@pytest.mark.parametrize(
    "case, grads",
    [
        *((case, False) for case in sorted(LAYOUT_CASES)),
        ("weights (B, T, S, H)", True),
        *(
            pytest.param(case, True, marks=pytest.mark.slow)
            for case in sorted(LAYOUT_CASES)
            if case != "weights (B, T, S, H)"
        ),
    ],
)
def test_an_output_in_another_layout_fails_naming_its_module_and_both_shapes(case, grads):
    """No layout is declared for a transformer block or an attention: a (B, D, T) output for
    torch's (B, T, D) is not read as channels-last, it fails; with --grads the outputs still
    fail first, so the gradients (whose cotangents differ) are not what is named."""
    name, mutant, shapes = LAYOUT_CASES[case]
    spec = parity_mutants.SPECS[name]()
    wrong = mutate.mutated_factory(spec.nnx_factory, mutant)
    report = diff(spec.torch_factory, wrong, grads=grads)
    module, row = report.first_divergent()
    assert module == "" and row.section == "outputs", format_report(report)
    assert shapes in row.note and "no layout declared for this module" in row.note, row.note


class _TorchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(2, 4)

    def forward(self, x):
        return self.norm(x)


class _NormNHWC(nnx.Module):
    """The stock nnx.GroupNorm on (N, H, W, C), torch's (N, C, H, W) at the edges."""

    def __init__(self):
        self.norm = nnx.GroupNorm(4, num_groups=2, epsilon=1e-5, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return jnp.moveaxis(self.norm(jnp.moveaxis(x, 1, -1)), -1, 1)


def _torch_norm():
    torch.manual_seed(0)
    return _TorchNorm(), (torch.randn(2, 4, 3, 5),)


def _nnx_norm(torch_module):
    return load_torch(_NormNHWC(), torch_module)


def test_a_layout_no_rule_declares_fails_naming_both_shapes(monkeypatch):
    """The GroupNorm rule declares channels-last: the stock nnx.GroupNorm's (N, H, W, C) output
    is compared in torch's layout. Without the declaration the row fails, naming both shapes."""
    declared = diff(_torch_norm, _nnx_norm)
    assert declared.passed, format_report(declared)
    monkeypatch.delitem(LAYOUTS, "GroupNorm")
    report = diff(_torch_norm, _nnx_norm)
    module, row = report.first_divergent()
    assert module == "norm" and row.note == (
        "out[0]: port shape (2, 3, 5, 4), torch (2, 4, 3, 5) (no layout declared for this module)"
    ), format_report(report)


def test_a_kind_is_never_skipped_in_silence():
    spec = parity_mutants.mlp()
    missing = Spec(spec.name, spec.torch_factory, spec.nnx_factory, spec.mutants[:1])
    with pytest.raises(ValueError, match="kinds neither mutated nor said not to apply") as e:
        missing.check()
    assert "\n" not in str(e.value) and "drop_bias" in str(e.value)
    both = Spec(spec.name, spec.torch_factory, spec.nnx_factory, spec.mutants, {**spec.not_applicable, "drop_bias": "x"})  # fmt: skip
    with pytest.raises(ValueError, match=r"both mutated and not applicable: \['drop_bias'\]"):
        both.check()
    assert set(spec.check().not_applicable) | {m.kind for m in spec.mutants} == set(KINDS)


@pytest.mark.parametrize(
    "mutant, expected",
    [
        (Mutant("drop_bias", "no_such_module"), "mutant drop_bias at 'no_such_module' cannot be made: AttributeError"),
        (Mutant("permute_axes", "", option=(0, (0, 1, 2, 3))), "mutant permute_axes at '(root)': the output cannot be changed: ValueError"),
    ],
    ids=["no-module", "wrong-permutation"],
)  # fmt: skip
def test_a_mutant_that_cannot_be_made_is_an_error_not_a_kill(mutant, expected):
    """A mutant whose module or output does not fit raises the table's one-line error; it is
    never counted as killed (the port raising would otherwise look like a failed diff)."""
    spec = parity_mutants.mha()
    mutants = [mutant, *spec.mutants]  # first: the run stops there
    bad = Spec(spec.name, spec.torch_factory, spec.nnx_factory, mutants, spec.not_applicable)
    with pytest.raises(UsageError) as e:
        mutate.run(bad)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)


def not_a_spec():
    return 3


def _parity(*args):
    return subprocess.run(
        [sys.executable, "-m", "parity", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_command_prints_the_kill_rate_and_exits_0(capsys):
    assert mutate.main(["tests.parity_mutants:mha"]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == (
        "kill rate nn.MultiheadAttention: 6/6 (100%; float32 6/6); named at the expected"
        " module: 6/6"
    ), out
    assert "query.kernel <-> key.kernel" in out and "not applicable: eps_x10: no norm" in out


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("tests.parity_mutants", "SPEC 'tests.parity_mutants': expected package.module:callable"),
        ("tests.test_parity_mutate:not_a_spec", "gave a int: expected a parity.mutate.Spec"),
    ],
    ids=["no-colon", "not-a-spec"],
)
def test_a_bad_spec_is_one_line(spec, expected, capsys):
    assert mutate.main([spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_help_lists_each_command_with_one_line():
    done = _parity("--help")
    assert done.returncode == 0, done.stderr
    for name in ("diff", "mutate", "gpt", "trm"):
        line = next((x for x in done.stdout.splitlines() if x.startswith(f"  {name} ")), None)
        assert line and len(line.split(None, 1)[1]) > 20, done.stdout
    bad = _parity("nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "unknown command 'nope', expected one of diff, mutate, gpt, trm" in bad.stderr
