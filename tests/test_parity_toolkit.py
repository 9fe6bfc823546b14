"""The parity toolkit itself (parity/capture.py, keymap.py, check.py, diff.py, goldens/module.py,
machine.py): the key map's rules reproduce both hand-written converters of this repository,
captures pair up on both sides (repeated calls, jit, methods) and leave no wrapper behind, the
command's exit codes and one-line errors, goldens of a torch module checked in a process where
torch cannot be imported, and the kernel identity that decides where a fixture's bits must be
reproduced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity import diff as diff_cli  # noqa: E402
from parity import machine  # noqa: E402
from parity.capture import capture_nnx, capture_torch, nnx_hooks, prefix_rename  # noqa: E402
from parity.check import compare_calls, format_report  # noqa: E402
from parity.compare import EXACT, FLOAT32, FLOAT64, assert_close  # noqa: E402
from parity.goldens import module as goldens  # noqa: E402
from parity.keymap import build_keymap, describe_torch, load_torch  # noqa: E402
from parity.state_dict import StateDictError  # noqa: E402
from parity.steps import SGD  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.parity_ports import ConvBN  # noqa: E402
from tests.test_parity_conv_bn import torch_conv_bn  # noqa: E402

# ------------------------------------------------------------------------------------ key maps


def test_rules_reproduce_the_nanogpt_converter():
    """By rule alone (Linear transposed to `kernel`, LayerNorm weight -> scale, Embedding ->
    `embedding`, `transformer.` flattened by a rename, lm_head tied to wte) the toolkit fills a
    GPT exactly as parity.gpt_params.from_torch does, and maps it back to the same state_dict."""
    from models.gpt import GPT, GPTConfig
    from parity import gpt_torch
    from parity.gpt_params import from_torch

    cfg = dict(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8, dropout=0.0, bias=True)
    torch.manual_seed(0)
    ref = gpt_torch.GPT(gpt_torch.GPTConfig(**cfg))
    expected = from_torch(ref.state_dict(), GPTConfig(**cfg))
    rename = prefix_rename({k: f"transformer.{k}" for k in ("wte", "wpe", "drop", "h", "ln_f")})
    km = build_keymap(describe_torch(ref), GPT(GPTConfig(**cfg), rngs=nnx.Rngs(1)), rename=rename)
    assert km.complete and km.tied == {"lm_head.weight": "transformer.wte.weight"}
    port = load_torch(GPT(GPTConfig(**cfg), rngs=nnx.Rngs(1)), ref, rename=rename)
    got = dict(nnx.to_flat_state(nnx.state(port, nnx.Param)))
    for path, value in nnx.to_flat_state(nnx.state(expected, nnx.Param)):
        assert_close(str(path), got[path].get_value(), value.get_value(), EXACT)
    back = km.to_torch(dict(nnx.to_flat_state(nnx.state(port))))
    for key, value in ref.state_dict().items():
        assert_close(key, back[key], value, EXACT)


def test_rules_reproduce_the_trm_converter():
    """TRM keeps torch's names and layouts (CastedLinear `weight` (out, in)): rule 1, a copy."""
    from models.trm import TRM
    from parity.trm_fixtures import make_pair, tiny_config
    from parity.trm_params import from_torch

    cfg = tiny_config("att")
    head, expected = make_pair(cfg)
    port = load_torch(
        TRM(cfg, rngs=nnx.Rngs(0)), head, rename=prefix_rename({"inner": "model.inner"})
    )
    want = dict(nnx.to_flat_state(nnx.state(from_torch(head.state_dict(), cfg))))
    got = dict(nnx.to_flat_state(nnx.state(port)))
    for path, var in want.items():
        if isinstance(var, nnx.RngState):
            continue
        assert_close(str(path), got[path].get_value(), var.get_value(), EXACT)


class _TwoLayers(nnx.Module):
    def __init__(self, n_out=3, *, rngs):
        self.fc1 = nnx.Linear(4, 5, rngs=rngs)
        self.fc2 = nnx.Linear(5, n_out, use_bias=False, rngs=rngs)
        self.extra = nnx.Param(jnp.zeros(2))


def test_the_map_reports_every_key_that_does_not_map():
    ref = torch.nn.Sequential()
    ref.add_module("fc1", torch.nn.Linear(4, 5))
    ref.add_module("fc2", torch.nn.Linear(5, 4))
    km = build_keymap(describe_torch(ref), _TwoLayers(rngs=nnx.Rngs(0)))
    assert km.unexpected == ["fc2.bias"] and km.missing == ["extra"]
    assert km.wrong_shapes == [
        "fc2.weight: torch (4, 5) (linear layout (5, 4)), port fc2.kernel (5, 3)"
    ]
    with pytest.raises(StateDictError) as e:
        km.check("Sequential state_dict")
    msg = str(e.value)
    assert "unexpected keys (1): fc2.bias" in msg and "missing keys (1): extra" in msg
    assert "fc2.weight: torch (4, 5)" in msg


def test_a_tie_is_covered_by_either_of_its_keys():
    """The port may hold either name of a tied pair."""
    ref = torch.nn.Module()
    ref.a, ref.b = torch.nn.Linear(3, 3, bias=False), torch.nn.Linear(3, 3, bias=False)
    ref.b.weight = ref.a.weight

    class Port(nnx.Module):
        def __init__(self, name, rngs):
            setattr(self, name, nnx.Linear(3, 3, use_bias=False, rngs=rngs))

    for held, tied in (("a", "b"), ("b", "a")):
        km = build_keymap(describe_torch(ref), Port(held, nnx.Rngs(0)))
        assert km.complete and km.tied == {f"{tied}.weight": f"{held}.weight"}


def test_conv_and_batchnorm_round_trip_exactly():
    """torch -> NNX -> torch is EXACT for every key, the OIHW/HWIO transposes included."""
    module, _ = torch_conv_bn()
    port = load_torch(ConvBN(bn="flax", rngs=nnx.Rngs(0)), module)
    km = build_keymap(describe_torch(module), port)
    back = km.to_torch(dict((p, v.get_value()) for p, v in nnx.to_flat_state(nnx.state(port))))
    for key, value in module.state_dict().items():
        if key not in km.dropped:
            assert_close(key, back[key], value, EXACT)
    assert port.conv1.kernel[...].shape == (3, 3, 3, 8)


# ------------------------------------------------------------------------------------ captures


class _Shared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.layer(torch.tanh(self.layer(x)))


class _SharedPort(nnx.Module):
    def __init__(self, rngs):
        self.layer = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
        return self.layer(jnp.tanh(self.layer(x)))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_module_called_twice_pairs_call_by_call(jit):
    torch.manual_seed(0)
    ref = _Shared()
    x = torch.randn(2, 4)
    port = load_torch(_SharedPort(nnx.Rngs(0)), ref)
    t = capture_torch(ref, (x,))
    j = capture_nnx(port, (jnp.asarray(x.numpy()),), jit=jit)
    assert [c.key for c in t.calls] == [c.key for c in j.calls] == [
        ("layer", "forward", 0), ("layer", "forward", 1), ("", "forward", 0)
    ]  # fmt: skip
    rows, notes = compare_calls(j.calls, t.calls, lambda _: FLOAT32)
    assert [r.label for r in rows] == ["layer [1/2]", "layer [2/2]", "(root)"]
    assert all(r.passed and r.inputs_agree for r in rows[:2]) and rows[2].passed and not notes


def test_nnx_hooks_leave_no_wrapper_behind():
    port = _SharedPort(nnx.Rngs(0))
    before = nnx.Linear.__dict__["__call__"], "__call__" in _SharedPort.__dict__
    with pytest.raises(RuntimeError), nnx_hooks(port):
        raise RuntimeError("the block fails")
    assert (nnx.Linear.__dict__["__call__"], "__call__" in _SharedPort.__dict__) == before


def test_methods_are_captured_by_name():
    """`methods=` records a method's calls as `<path>.<method>` on both sides (TRM's
    _input_embeddings is captured this way)."""

    class T(torch.nn.Module):
        def embed(self, x):
            return 2 * x

        def forward(self, x):
            return self.embed(x) + 1

    class J(nnx.Module):
        def embed(self, x):
            return 2 * x

        def __call__(self, x):
            return self.embed(x) + 1

    t = capture_torch(T(), (torch.ones(2),), methods=("embed",))
    j = capture_nnx(J(), (jnp.ones(2),), methods=("embed",))
    assert [c.key for c in t.calls] == [c.key for c in j.calls] == [
        ("", "embed", 0), ("", "forward", 0)
    ]  # fmt: skip
    rows, _ = compare_calls(j.calls, t.calls, lambda _: EXACT)
    assert [r.label for r in rows] == ["(root).embed", "(root)"] and all(r.passed for r in rows)


def test_jitted_capture_with_grads_equals_eager(x64):
    torch.manual_seed(0)
    ref = _Shared().double()
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4)))
    port = load_torch(_SharedPort(nnx.Rngs(0)), ref)
    eager = capture_nnx(port, (x,), grads=True)
    jitted = capture_nnx(port, (x,), grads=True, jit=True)
    assert_close("loss", jitted.loss, eager.loss, FLOAT64)
    for path, g in eager.grads.items():
        assert_close(str(path), jitted.grads[path], g, FLOAT64)


# ------------------------------------------------------------------------------------ command


def returns_a_module():
    return torch.nn.Linear(2, 2)


def returns_a_list_of_inputs():
    return torch.nn.Linear(2, 2), [torch.ones(2)]


def returns_a_list_of_kwargs():
    return torch.nn.Linear(2, 2), (), [torch.ones(2)]


def returns_a_dict(torch_module):
    return {"weight": torch_module.weight}


NOT_CALLABLE = 3


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2), (torch.ones(1, 2),)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["tests.test_parity_mlp", "x:y"], "TORCH_FACTORY 'tests.test_parity_mlp': expected package.module:callable"),
        (["no_such_pkg.mod:f", "x:y"], "TORCH_FACTORY 'no_such_pkg.mod:f': cannot import 'no_such_pkg.mod'"),
        (["tests.test_parity_toolkit:nope", "x:y"], "module 'tests.test_parity_toolkit' has no attribute 'nope'"),
        (["tests.test_parity_toolkit:NOT_CALLABLE", "x:y"], "'NOT_CALLABLE' is a int, not a callable"),
        (
            ["tests.test_parity_toolkit:returns_a_module", "tests.test_parity_mlp:nnx_mlp"],
            "TORCH_FACTORY tests.test_parity_toolkit:returns_a_module returned a Linear: expected (torch.nn.Module, tuple of example inputs[, dict of keyword inputs])",
        ),
        (
            ["tests.test_parity_toolkit:returns_a_list_of_inputs", "tests.test_parity_mlp:nnx_mlp"],
            "returned inputs of type list: expected a tuple of example inputs",
        ),
        (
            ["tests.test_parity_toolkit:returns_a_list_of_kwargs", "tests.test_parity_mlp:nnx_mlp"],
            "returned keyword inputs of type list: expected a dict from argument name to input",
        ),
        (
            ["tests.test_parity_toolkit:_linear", "tests.test_parity_toolkit:returns_a_dict"],
            "NNX_FACTORY tests.test_parity_toolkit:returns_a_dict returned a dict: expected a flax.nnx.Module",
        ),
        (["a:b", "c:d", "--rename", "h"], "--rename 'h': expected NNX_PREFIX=TORCH_PREFIX"),
    ],
    ids=["no-colon", "no-module", "no-attr", "not-callable", "torch-returns", "inputs-list", "kwargs-list", "nnx-returns", "rename"],
)  # fmt: skip
def test_bad_input_is_one_line(args, expected, capsys):
    assert diff_cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def port_with_a_typo(torch_module):
    """The cookbook MLP with fc2 stored as fc3: its weights cannot be loaded by rule."""
    from tests.test_parity_mlp import MLP

    port = MLP(rngs=nnx.Rngs(0))
    port.fc3 = port.fc2
    del port.fc2
    return load_torch(port, torch_module)


def test_a_port_that_does_not_map_is_named_key_by_key(capsys):
    args = ["tests.test_parity_mlp:torch_mlp", "tests.test_parity_toolkit:port_with_a_typo"]
    assert diff_cli.main(args) == 2
    err = capsys.readouterr().err
    assert "TorchMLP state_dict does not match the model" in err
    assert "unexpected keys (2): fc2.weight, fc2.bias" in err
    assert "missing keys (2): fc3.bias, fc3.kernel" in err


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "parity", "diff", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_command_exits_0_when_every_module_agrees_and_1_naming_the_first_divergent():
    ok = _run("tests.test_parity_mlp:torch_mlp", "tests.test_parity_mlp:nnx_mlp", "--grads")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "fc2" in ok.stdout and ok.stdout.strip().endswith(
        "every compared tensor agrees (20 rows)"
    )
    bad = _run(
        "tests.test_parity_mlp:torch_mlp", "tests.test_parity_mlp:nnx_mlp_flax_eps",
        "--dtype", "float64",
    )  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.strip().splitlines()[-1] == "first divergent module: norm"


# ------------------------------------------------------------------------------------- goldens

_CHECK_WITHOUT_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this process")

sys.meta_path.insert(0, NoTorch())
import jax
jax.config.update("jax_enable_x64", True)
from flax import nnx
from parity.check import format_report
from parity.goldens import module as goldens
from tests.parity_ports import ConvBN

out = {}
for bn in ("torch", "flax"):
    report = goldens.check(sys.argv[1], "conv_bn", ConvBN(bn=bn, param_dtype="float64", rngs=nnx.Rngs(0)))
    found = report.first_divergent()
    out[bn] = [report.passed, found and found[0], len(report.rows), format_report(report)]
out["torch_imported"] = any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print(__import__("json").dumps(out))
"""


def test_goldens_of_a_module_are_checked_without_torch(tmp_path):
    """Record conv -> BatchNorm in train mode (float64, 2 SGD-momentum steps, the one-ulp
    envelope of 2 perturbed runs); a process that cannot import torch loads the fixture into the
    port: every output, running statistic, gradient and step agrees (FLOAT64, the conv biases'
    round-off gradients by the envelope); the stock nnx.BatchNorm is named at bn1."""
    module, (x,) = torch_conv_bn()
    module, x = module.double(), x.double()
    goldens.record(
        tmp_path, "conv_bn", module, (x,), optimizer=SGD(0.05, momentum=0.9), steps=2,
        train=True, envelope_seeds=(1, 2),
    )  # fmt: skip
    manifest = json.loads((tmp_path / "manifest.json").read_text())["conv_bn"]
    assert manifest["threads"] == 1 and manifest["cpu_capability"] and manifest["torch"]
    assert machine.same_kernels(manifest["machine"]), machine.difference(manifest["machine"])
    env = dict(os.environ, PYTHONPATH=REPO)
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHECK_WITHOUT_TORCH), str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["torch_imported"] is False
    passed, _, n_rows, table = out["torch"]
    assert passed, table
    assert n_rows == 5 + 6 + 8 + 2 * (1 + 14)  # outputs, buffers, grads, 2 steps
    passed, first, _, table = out["flax"]
    assert not passed and first == "bn1", table


# ------------------------------------------------------------------------------ the kernels


def test_the_kernel_identity_names_the_first_field_that_differs():
    """A manifest's "machine" read back is the same kernels; each kernel field changed alone is
    named; a manifest without the record (or without a field) is never the same; a knob counts
    through what it changes (MKL_ENABLE_INSTRUCTIONS: MKL's banner) unless nothing shows its
    effect (ONEDNN_MAX_CPU_ISA, compared as set)."""
    here = json.loads(json.dumps(machine.identity()))
    assert machine.difference(here) is None and machine.same_kernels(here)
    assert here["torch_threads"] == torch.get_num_threads()
    for field in machine.KERNEL_FIELDS:
        other = {**here, field: "other"}
        assert machine.difference(other) == f"{field}: recorded 'other', here {here[field]!r}"
        missing = {k: v for k, v in here.items() if k != field}
        assert machine.difference(missing).startswith(f"{field}: recorded 'unknown'")
    for old in (None, {}):
        assert machine.difference(old).startswith("machine: not recorded")
    env = here["env"]
    assert machine.same_kernels({**here, "env": {**env, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}})
    onednn = {**here, "env": {**env, "ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert machine.difference(onednn).startswith("env ONEDNN_MAX_CPU_ISA")


def test_a_field_that_could_not_be_read_matches_nothing(monkeypatch):
    here = machine.identity()
    blind = {**machine._blas(), "mkl_code_path": machine.UNKNOWN}
    monkeypatch.setattr(machine, "_blas", lambda: blind)
    assert machine.difference({**here, **blind}).startswith("mkl_code_path")


def test_mkl_verbose_gives_the_code_path_and_the_cnr_mode():
    """MKL's banner names the code path it dispatched (the generic one on an AMD CPU, its own
    AVX2 / AVX-512 kernels on an Intel one); the call line names the CNR mode (MKL_CBWR)."""
    call = "MKL_VERBOSE DGEMM(N,N,4,4,4,0x1,0x2,4,0x2,4,0x3,0x4,4) 5.12us CNR:{} Dyn:1 TID:0 NThr:1"
    amd = (
        "MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture "
        "Intel(R) Architecture processors, Lnx 2.60GHz lp64 gnu_thread"
    )
    avx2 = (
        "MKL_VERBOSE Intel(R) MKL 2019.0 Update 2 Product build 20190118 for Intel(R) 64 "
        "architecture Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, "
        "Lnx 2.40GHz intel_thread"
    )
    avx512 = (  # an AVX-512 code path has commas of its own
        "MKL_VERBOSE oneMKL 2024.0 Product build 20231011 for Intel(R) 64 architecture Intel(R) "
        "Advanced Vector Extensions 512 (Intel(R) AVX-512) with support of Intel(R) Deep Learning "
        "Boost (Intel(R) DL Boost), EVEX-encoded AES and Carry-Less Multiplication Quadword "
        "instructions, Lnx 2.00GHz lp64 gnu_thread"
    )
    parse = machine.parse_mkl_verbose
    assert parse(f"{amd}\n{call.format('OFF')}\n") == {
        "mkl_code_path": "Intel(R) Architecture processors",
        "mkl_cnr": "OFF",
    }
    assert parse(f"{avx2}\n{call.format('COMPATIBLE')}") == {
        "mkl_code_path": "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors",
        "mkl_cnr": "COMPATIBLE",
    }
    assert parse(avx512)["mkl_code_path"].endswith(
        "Carry-Less Multiplication Quadword instructions"
    )
    assert parse(call.format("AUTO")) == {"mkl_code_path": "unknown", "mkl_cnr": "AUTO"}


def test_the_mkl_probe_runs_once_per_process(monkeypatch):
    first = machine.identity()

    def probe_again():
        raise AssertionError("MKL probed twice")

    monkeypatch.setattr(machine, "_mkl_verbose_in_process", probe_again)
    monkeypatch.setattr(machine, "_mkl_verbose_in_subprocess", probe_again)
    assert machine.identity() == first


def test_record_refuses_an_argument_it_cannot_store(tmp_path):
    module, (x,) = torch_conv_bn()
    with pytest.raises(TypeError, match="argument 1 is a dict; goldens take tensors"):
        goldens.record(tmp_path, "bad", module, (x, {"a": 1}))


def test_format_report_on_a_passing_run_names_no_module():
    port = lambda m: load_torch(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), m)  # noqa: E731
    report = diff_cli.diff(_linear, port, grads=True)
    text = format_report(report)
    assert report.passed and "first divergent" not in text
    assert text.endswith("every compared tensor agrees (5 rows)")  # 2 weights, 1 output, 2 grads


# ------------------------------------------------------------------------------ channels-last


@pytest.mark.slow  # the default tier: a wrong channels-last module is named
def test_a_channels_last_port_is_compared_in_torch_layout(x64):
    """Stock nnx.GroupNorm / nnx.Conv inside a port on NHWC: every module's output is compared
    after moving its channel axis back (float64, with gradients), through the channels-last
    layout the conv family's rules declare, and a note names those calls and the rules."""
    from tests import parity_upblock as up

    report = diff_cli.diff(up.torch_up, up.nnx_up, dtype="float64", grads=True)
    text = format_report(report)
    assert report.passed, text
    assert [r.module for r in report.section("outputs")] == ["norm", "up", "conv", "skip", ""]
    assert (
        "note: 4 port calls in the channels-last layout (N, *spatial, C) for torch's"
        " (N, C, *spatial), compared in torch's, declared by the rule of GroupNorm: norm;"
        " _ConvNd: up, conv, skip"
    ) in text, text


def test_a_wrong_channels_last_module_is_named(x64):
    """The permutation changes no value: GroupNorm with flax's epsilon is named, inputs agreeing."""
    from tests import parity_upblock as up

    report = diff_cli.diff(up.torch_up, up.nnx_up_flax_eps, dtype="float64")
    module, row = report.first_divergent()
    assert module == "norm" and row.inputs_agree is True, format_report(report)


def test_channels_equal_to_spatial_sizes_are_named_as_the_likely_cause(x64):
    """8 channels on an 8 x 8 map: the norm's NHWC input and output have torch's NCHW shapes, so
    they are compared as they are and fail (the name moves up to the root, whose inputs agree);
    the note names norm and says its output agrees read as channels-last."""
    from tests import parity_upblock as up

    report = diff_cli.diff(up.torch_up_square, up.nnx_up, dtype="float64")
    text = format_report(report)
    failed = [r.module for r in report.rows if r.passed is False]
    assert failed == ["norm"] and report.first_divergent()[0] == "", text
    assert "note: norm: its output agrees read as channels-last" in text


def test_heads_on_their_own_axis_are_compared_only_where_declared():
    """A port output (..., heads, head_dim) is torch's (..., heads * head_dim) read head-major
    where the HEADS layout is declared for its module; the same numbers split head-minor fail,
    and sizes that do not multiply out are no match. Undeclared, the shapes must be torch's."""
    from parity.check import compare_leaves, in_torch_layout
    from parity.keymap import HEADS

    torch_out = np.random.default_rng(0).normal(size=(2, 3, 8))
    head_major = torch_out.reshape(2, 3, 2, 4)  # feature n * 4 + h
    head_minor = torch_out.reshape(2, 3, 4, 2).swapaxes(-1, -2)  # feature h * 2 + n
    np.testing.assert_array_equal(in_torch_layout(head_major, torch_out, HEADS), torch_out)
    assert compare_leaves("out", [head_major], [torch_out], FLOAT64, layout=HEADS)[0]
    assert not compare_leaves("out", [head_minor], [torch_out], FLOAT64, layout=HEADS)[0]
    assert in_torch_layout(np.zeros((2, 3, 3, 3)), torch_out, HEADS) is None
    passed, _, _, note = compare_leaves("out", [head_major], [torch_out], FLOAT64)
    assert not passed and note == (
        "out[0]: port shape (2, 3, 2, 4), torch (2, 3, 8) (no layout declared for this module)"
    )


# ------------------------------------------------------------------- this repository's ports


@pytest.mark.slow  # the default tier: one weight off in nanoGPT is named through it
def test_nanogpt_through_the_generic_diff():
    """`python -m parity diff parity.report_gpt:torch_factory parity.report_gpt:nnx_factory
    --rename =transformer --grads --dtype float64`: the port built by its own converter agrees
    with torch in every module torch calls that the port has (gelu is inline, lm_head is the
    tied wte), and in all 28 gradients, within FLOAT64."""
    from parity import report_gpt

    report = diff_cli.diff(
        report_gpt.torch_factory, report_gpt.nnx_factory, dtype="float64", grads=True,
        rename=prefix_rename({"": "transformer"}),
    )  # fmt: skip
    assert report.passed, format_report(report)
    missing = [r.label for r in report.section("outputs") if r.passed is None]
    assert missing == ["transformer.h.0.mlp.gelu", "transformer.h.1.mlp.gelu", "lm_head"]
    assert len(report.section("grads")) == 28 and all(r.passed for r in report.section("grads"))


def _gpt_port_one_weight_off(torch_module):
    """The nanoGPT port with element (0, 0) of h.1.mlp.c_fc's weight moved by 1e-3."""
    from parity import report_gpt

    port = report_gpt.nnx_factory(torch_module)
    kernel = port.h[1].mlp.c_fc.kernel
    kernel[...] = jnp.asarray(kernel[...]).at[0, 0].add(1e-3)
    return port


def test_one_weight_off_in_nanogpt_is_named():
    """The weights section names the tensor (EXACT, worst index (0, 0)); the outputs agree
    until transformer.h.1.mlp.c_fc, the first output that differs, with its inputs agreeing."""
    from parity import report_gpt

    report = diff_cli.diff(
        report_gpt.torch_factory, _gpt_port_one_weight_off, dtype="float64",
        rename=prefix_rename({"": "transformer"}),
    )  # fmt: skip
    module, row = report.first_divergent()
    assert (module, row.label) == ("transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.c_fc.weight")
    assert row.comparison.worst_index == (0, 0)
    outputs = report.section("outputs")
    first = next(i for i, r in enumerate(outputs) if r.passed is False)
    assert outputs[first].label == "transformer.h.1.mlp.c_fc" and outputs[first].inputs_agree
    assert all(r.passed is not False for r in outputs[:first])


def test_one_weight_off_in_trm_is_named(x64):
    """The same for TRM's per-block capture: 1e-3 on element (0, 0) of L_level.layers.1's
    down_proj: every row before the first call of layers.1 agrees within FLOAT64, that call is
    the first that differs."""
    from parity.trm_fixtures import (
        make_batch,
        make_pair,
        one_step_comparisons,
        tiny_config,
        to_float64,
    )

    cfg = tiny_config("att", "float64")
    head, model = to_float64(*make_pair(cfg))
    for m in (head, model):
        m.eval()
    w = model.inner.L_level.layers[1].mlp.down_proj.weight
    w[...] = w[...].at[0, 0].add(1e-3)
    rows = one_step_comparisons(head, model, make_batch(cfg), FLOAT64)
    first = next(i for i, r in enumerate(rows) if not r.passed)
    assert rows[first].name == "L_level.layers.1 [1/6]", [r.message() for r in rows[: first + 1]]
    assert all(r.passed for r in rows[:first]) and first > 0


def test_every_main_block_in_parity_comes_last():
    """A module run with `python -m` executes its `if __name__ == "__main__":` block where it
    stands: any function defined below it does not exist yet (report_trm's rollout raised
    NameError that way). In every parity module the block is the last statement."""
    import ast
    import pathlib

    late = []
    for path in sorted(pathlib.Path(REPO, "parity").rglob("*.py")):
        body = ast.parse(path.read_text()).body
        for i, node in enumerate(body):
            if (
                isinstance(node, ast.If)
                and "__main__" in ast.unparse(node.test)
                and i < len(body) - 1
            ):
                late.append(f"{path.name}:{node.lineno}")
    assert not late, late


@pytest.mark.slow
def test_trm_report_rollout_runs_as_a_module():
    """`python -m parity.report_trm --rollout eval` runs its main after every helper it calls is
    defined (a __main__ block above them raised NameError)."""
    run = subprocess.run(
        [sys.executable, "-m", "parity.report_trm", "--rollout", "eval", "--variant", "att",
         "--L-cycles", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.split()[:1] == ["16"]]
    assert rows and "FAIL" not in run.stdout
