"""The key map's rules for ConvTranspose1d/2d/3d, nn.LSTM / nn.GRU / nn.RNN (two layers, and
bidirectional) and nn.MultiheadAttention, onto their flax counterparts in parity/layers.py: both
ways (torch -> NNX computes what torch computes, float64 within FLOAT64; NNX -> torch is EXACT),
a rule of one's own through `register_rule`, groups refused in one line, the self-containment of
the toolkit (it imports nothing from the project's models/, train/, data/), and
`--dtype bfloat16`."""

from __future__ import annotations

import ast
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity import layers  # noqa: E402
from parity.capture import nnx_state  # noqa: E402
from parity.check import format_report  # noqa: E402
from parity.compare import BFLOAT16, EXACT, FLOAT64, assert_close  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import LINEAR, RULES, To, build_keymap, describe_torch, load_torch, register_rule  # noqa: E402
from tests.helpers import REPO as _REPO  # noqa: E402

REPO = pathlib.Path(_REPO)


class _Holder(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m


class _Port(nnx.Module):
    def __init__(self, m):
        self.m = m


def _both_ways(torch_module, port_module, run_torch, run_port):
    """load by rule, run both in float64, map the port back: (output error, back == torch)."""
    holder = _Holder(torch_module.double())
    port = load_torch(_Port(port_module), holder)
    km = build_keymap(describe_torch(holder), port).check()
    back = km.to_torch(nnx_state(port))
    for key, value in holder.state_dict().items():
        assert_close(key, back[key], value, EXACT)
    for got, want in zip(run_port(port.m), run_torch(holder.m)):
        assert_close("output", got, want.detach(), FLOAT64)
    return km


CONV_T = [  # n, kernel, stride, padding, output_padding, dilation
    (1, 3, 2, 1, 1, 1),
    (2, 4, 2, 1, 0, 1),
    (2, 3, 2, 1, 1, 2),
    (2, (3, 2), (2, 1), (1, 0), (1, 0), 1),
    (3, 3, 1, 0, 0, 1),
]


@pytest.mark.parametrize("n,k,s,p,op,d", CONV_T)
def test_conv_transpose_both_ways(n, k, s, p, op, d, x64):
    torch.manual_seed(0)
    t = getattr(torch.nn, f"ConvTranspose{n}d")(3, 5, k, s, p, op, dilation=d)
    port = layers.conv_transpose(
        3, 5, k, s, p, op, dilation=d, n=n, channels_first=True, param_dtype="float64",
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    x = torch.randn(2, 3, *([6] * n), dtype=torch.float64)
    km = _both_ways(t, port, lambda m: [m(x)], lambda m: [m(jnp.asarray(x.numpy()))])
    assert [e.layout.name for e in km.entries] == ["conv", "same"]


def test_conv_transpose_padding_correspondence():
    """torch padding p <-> flax k-1-p per side (times the dilation), output_padding at the end."""
    assert layers.conv_transpose_padding(4, 1, n=2) == [(2, 2), (2, 2)]
    assert layers.conv_transpose_padding(3, 1, 1, n=1) == [(1, 2)]
    assert layers.conv_transpose_padding(3, 1, 0, 2, n=1) == [(3, 3)]


def test_grouped_conv_transpose_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^ConvTranspose2d\(groups=2\): flax's") as e:
        layers.conv_transpose(4, 4, 3, groups=2, rngs=nnx.Rngs(0))
    assert "\n" not in str(e.value)


RECURRENT = [
    ("LSTM", {}, False),
    ("LSTM", {}, True),
    ("LSTM", {"split_gates": True}, False),
    ("LSTM", {"split_gates": True}, True),
    ("GRU", {}, False),
    ("GRU", {}, True),
    ("RNN", {}, True),
]


@pytest.mark.parametrize("kind,kw,bidirectional", RECURRENT)
def test_recurrent_both_ways(kind, kw, bidirectional, x64):
    """Two layers, batch_first, an initial state: output and final state within FLOAT64."""
    torch.manual_seed(0)
    t = getattr(torch.nn, kind)(4, 6, 2, batch_first=True, bidirectional=bidirectional)
    port = getattr(layers, kind)(
        4, 6, 2, batch_first=True, bidirectional=bidirectional, param_dtype="float64",
        rngs=nnx.Rngs(0), **kw,
    )  # fmt: skip
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    h0 = torch.randn(2 * (2 if bidirectional else 1), 3, 6, dtype=torch.float64)
    hx = (h0, torch.randn_like(h0)) if kind == "LSTM" else h0
    jhx = tuple(jnp.asarray(h.numpy()) for h in hx) if kind == "LSTM" else jnp.asarray(h0.numpy())

    def flat(out):
        y, h = out
        return [y, *(h if isinstance(h, tuple) else (h,))]

    _both_ways(t, port, lambda m: flat(m(x, hx)), lambda m: flat(m(jnp.asarray(x.numpy()), jhx)))


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_both_ways(batch_first, x64):
    """The packed in_proj in thirds to query / key / value; bool causal mask, key padding mask,
    head-averaged weights."""
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)
    port = layers.MultiheadAttention(
        8, 2, batch_first=batch_first, param_dtype="float64", rngs=nnx.Rngs(0)
    )
    x = torch.randn(5, 3, 8, dtype=torch.float64)  # (T, B, E)
    x = x.transpose(0, 1).contiguous() if batch_first else x
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, -1] = True
    kw = dict(attn_mask=mask, key_padding_mask=pad)
    jkw = {k: jnp.asarray(v.numpy()) for k, v in kw.items()}
    xj = jnp.asarray(x.numpy())
    km = _both_ways(t.eval(), port, lambda m: m(x, x, x, **kw), lambda m: m(xj, xj, xj, **jkw))
    assert {e.nnx_path[-2:] for e in km.entries if e.chunks == 3} >= {("query", "kernel")}


def test_stock_flax_attention_softmax_is_float32_in_a_float64_run(x64):
    """nnx.MultiHeadAttention's default attention hands a call without dropout to
    jax.nn.dot_product_attention (softmax in float32): 1e-9..1e-7 off in float64, where
    parity.layers.attention (written out) agrees within FLOAT64."""
    torch.manual_seed(0)
    t = _Holder(torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval())
    stock = nnx.MultiHeadAttention(2, 8, decode=False, param_dtype="float64", rngs=nnx.Rngs(0))
    stock = load_torch(_Port(stock), t)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    want = t.m(x, x, x, need_weights=False)[0].detach()
    err = float(np.abs(np.asarray(stock.m(jnp.asarray(x.numpy()))) - want.numpy()).max())
    assert 1e-12 < err < 1e-5, err


def test_a_rule_of_ones_own():
    """register_rule: a torch class of one's own whose `w` (out, in) is the port's Linear kernel."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 4))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = Scaled()

    class Port(nnx.Module):
        def __init__(self):
            self.proj = nnx.Linear(4, 3, use_bias=False, rngs=nnx.Rngs(0))

    assert not build_keymap(describe_torch(Model()), Port()).complete
    register_rule(Scaled, {"w": To("kernel", LINEAR)})
    try:
        ref = Model()
        port = load_torch(Port(), ref)
        assert_close("w", port.proj.kernel[...], ref.proj.w.detach().T, EXACT)
    finally:
        RULES.pop("Scaled")


def test_bfloat16_diff_passes_a_right_port_with_gradients():
    """Each row of the GRU tagger names the bound it got: BFLOAT16, or 3 x torch's own bf16
    error where that is wider (most of the gradients: long sums over the sequence)."""
    from tests import test_parity_gru as gru

    report = diff(gru.torch_tagger, gru.nnx_tagger, dtype="bfloat16", grads=True)
    text = format_report(report)
    assert report.passed, text
    widened = 0
    for row in [r for r in report.rows if r.comparison and r.section != "weights"]:
        tol = row.comparison.tolerance
        named = tol.name == "bfloat16" or tol.name.startswith("3 x torch's own ")
        assert named and tol.name in text, tol
        if tol.name != "bfloat16":
            own = float(tol.name.rsplit(" ", 1)[1])  # torch's own error, as printed (2 digits)
            assert tol.rtol > BFLOAT16.rtol and abs(tol.rtol - 3 * own) <= 0.05 * tol.rtol, tol
            widened += row.section == "grads"
    assert widened > len(report.section("grads")) // 2, text


def test_the_bfloat16_run_says_what_it_is(capsys):
    """--help and the report's header say it: a pure bf16 module (module.to(torch.bfloat16)),
    not autocast, and the bound per tensor with where it comes from."""
    from parity.diff import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "pure bf16 run, not autocast" in text and "module.to(torch.bfloat16)" in text, text
    assert main(["tests.test_parity_gru:torch_tagger", "tests.test_parity_gru:nnx_tagger", "--dtype", "bfloat16"]) == 0  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(
        "bound per tensor BFLOAT16 (1e-2), or 3 x torch's own bf16 error against its float64 run"
        " where that is wider (BFLOAT16_AS_TORCH); each row names its bound"
    ), out[0]
    assert out[1].startswith("bfloat16 is a pure bf16 run, not autocast"), out[1]


def test_bfloat16_diff_names_a_wrong_port():
    """The bf16 bound still fails the GRU of the other kind (reset gate before the matmul)."""
    from tests import test_parity_gru as gru

    report = diff(gru.torch_tagger, gru.nnx_tagger_reset_before, dtype="bfloat16", grads=True)
    module, row = report.first_divergent()
    assert module == "gru" and row.inputs_agree is True, format_report(report)


# ------------------------------------------------------------------------------ self-contained


def _toolkit_modules() -> tuple[str, ...]:
    """The toolkit distribution's modules (toolkit/pyproject.toml py-modules) as parity/ paths."""
    import tomllib

    listed = tomllib.loads((REPO / "toolkit" / "pyproject.toml").read_text())["tool"]["setuptools"]
    return tuple(
        "/".join(m.split(".")[1:]) + ".py" for m in listed["py-modules"]
    )  # "parity.goldens.common" -> "goldens/common.py"


TOOLKIT = _toolkit_modules()


def test_the_toolkit_imports_nothing_of_models_train_data():
    """Every import statement of the toolkit's modules, at any level, read with ast."""
    bad = []
    for name in TOOLKIT:
        tree = ast.parse((REPO / "parity" / name).read_text())
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            bad += [f"{name}: {m}" for m in mods if m.split(".")[0] in ("models", "train", "data")]
    assert not bad, bad


def test_toolkit_list_covers_the_package():
    """A new toolkit module is listed above (reference implementations and reports are not
    toolkit: they may import the project's models)."""
    project = {"gpt_torch.py", "gpt_params.py", "report_gpt.py", "report_trm.py", "trm_fixtures.py"}
    files = {
        str(p.relative_to(REPO / "parity"))
        for p in (REPO / "parity").rglob("*.py")
        if "trm_torch" not in p.parts
        and not p.name.startswith(("trm", "nanogpt"))
        and p.parent.name in ("parity", "goldens")
        and p.name not in project
    }
    assert files <= set(TOOLKIT) | {"goldens/__main__.py"}, files - set(TOOLKIT)
