"""torch.nn.Conv2d + torch.nn.BatchNorm2d, in eval and in train mode, ported to Flax NNX with the
parity toolkit (tests/parity_ports.py):

- eval mode: the stock nnx.BatchNorm (axis 1, torch's eps) fed torch's running statistics by the
  key map's BatchNorm rule, and a Conv2d whose HWIO kernel comes from torch's OIHW weight by the
  conv rule: weights EXACT, outputs and gradients within FLOAT32 and FLOAT64;
- train mode: a BatchNorm2d with torch's running statistics (momentum on the new batch, unbiased
  variance stored): outputs, running statistics after the call and gradients within FLOAT64,
  three SGD steps with the statistics after each;
- wrong on purpose: the stock nnx.BatchNorm in train mode (named by its running variance), and
  padding="SAME" for torch's padding=1 at stride 2 (named at conv2).

    python -m parity diff tests.test_parity_conv_bn:torch_conv_bn \
        tests.test_parity_conv_bn:nnx_conv_bn --train --dtype float64 --grads
"""

from __future__ import annotations

import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity.check import format_report  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import build_keymap, describe_torch, load_torch, param_dtype  # noqa: E402
from parity.steps import SGD, compare_steps  # noqa: E402
from tests.parity_ports import ConvBN  # noqa: E402


class TorchConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))


def torch_conv_bn():
    """TORCH_FACTORY: running statistics moved off their (0, 1) start by two train-mode batches
    (so eval mode reads non-trivial ones), and a batch of 2 images 3 x 8 x 8 (mean 3, spread 2)."""
    torch.manual_seed(0)
    module = TorchConvBN()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(2):
            module(3 + 2 * torch.randn(4, 3, 8, 8, generator=g))
    return module, (3 + 2 * torch.randn(2, 3, 8, 8, generator=g),)


def _port(torch_module, **kw):
    port = ConvBN(param_dtype=param_dtype(torch_module), rngs=nnx.Rngs(0), **kw)
    return load_torch(port, torch_module)


def nnx_conv_bn(torch_module):
    """NNX_FACTORY for both modes: BatchNorm2d with torch's running statistics."""
    return _port(torch_module)


def nnx_conv_stock_bn(torch_module):
    """Right in eval mode only: the stock nnx.BatchNorm."""
    return _port(torch_module, bn="flax")


def nnx_conv_bn_same_padding(torch_module):
    """Wrong on purpose: conv2 pads like "SAME" (0 before, 1 after) instead of 1 on each side."""
    return _port(torch_module, flax_same=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("port", [nnx_conv_bn, nnx_conv_stock_bn], ids=["BatchNorm2d", "stock"])
def test_eval_mode_agrees_with_gradients(port, dtype):
    report = diff(torch_conv_bn, port, dtype=dtype, grads=True)
    assert report.passed, format_report(report)
    assert [r.label for r in report.section("outputs")] == [
        "conv1", "bn1", "conv2", "bn2", "(root)"
    ]  # fmt: skip


def test_stock_batchnorm_map_uses_the_rules():
    """The conv rule (OIHW -> HWIO `kernel`) and the BatchNorm rule (weight -> scale, running_*
    -> mean / var, num_batches_tracked dropped: nnx.BatchNorm has no counter)."""
    module, _ = torch_conv_bn()
    km = build_keymap(describe_torch(module), nnx_conv_stock_bn(module))
    assert km.complete and km.dropped == ["bn1.num_batches_tracked", "bn2.num_batches_tracked"]
    layouts = {e.torch_key: (".".join(map(str, e.nnx_path)), e.layout.name) for e in km.entries}
    assert layouts["conv1.weight"] == ("conv1.kernel", "conv")
    assert layouts["bn1.running_var"] == ("bn1.var", "same")
    assert layouts["bn1.weight"] == ("bn1.scale", "same")


def test_train_mode_agrees_with_running_statistics_and_gradients():
    """Outputs and running statistics within FLOAT64 (the counter EXACT); gradients within
    FLOAT64 except the conv biases, whose exact gradient is 0 (see the next test): those are
    judged by 16x torch's own one-ulp envelope."""
    report = diff(
        torch_conv_bn, nnx_conv_bn, dtype="float64", grads=True, train=True, use_envelope=True
    )
    assert report.passed, format_report(report)
    state = {r.label for r in report.section("state") if r.passed}
    assert state == {
        f"bn{i}.{name}"
        for i in (1, 2)
        for name in ("running_mean", "running_var", "num_batches_tracked")
    }
    widened = {r.label for r in report.section("grads") if r.comparison.tolerance.rtol > 1e-12}
    assert widened == {"conv1.bias", "conv2.bias"}, format_report(report)


def test_a_bias_before_train_mode_batchnorm_has_a_zero_gradient_of_round_off():
    """BatchNorm in train mode subtracts the batch mean per channel, so the conv bias before it
    has no effect and its exact gradient is 0; both sides compute ~1e-15 of round-off instead,
    which is all of that tensor's scale: FLOAT64 fails on it (and on nothing else)."""
    report = diff(torch_conv_bn, nnx_conv_bn, dtype="float64", grads=True, train=True)
    bad = [r for r in report.rows if r.passed is False]
    assert [r.label for r in bad] == ["conv1.bias", "conv2.bias"], format_report(report)
    assert all(r.comparison.scale < 1e-13 for r in bad)


def test_three_sgd_steps_in_train_mode_match_torch_float64(x64):
    """Parameters and running statistics after each step within FLOAT64, the counter EXACT."""
    module, (x,) = torch_conv_bn()
    module = module.double()
    # SGD adds lr x the bias' round-off gradient (~1e-15): far under the bias itself
    report = compare_steps(module, nnx_conv_bn(module), (x.double(),), SGD(0.05), steps=3)
    assert report.passed, format_report(report)
    assert any(r.label == "step 3 bn2.running_var" for r in report.rows)


def test_stock_batchnorm_in_train_mode_is_named_by_its_running_variance():
    """The outputs agree (both normalise with the biased batch variance); the running variance
    it stores is the biased one, torch's the unbiased one (n / (n - 1) = 128 / 127 at bn1)."""
    report = diff(torch_conv_bn, nnx_conv_stock_bn, dtype="float32", train=True)
    assert all(r.passed is not False for r in report.section("outputs"))
    module, row = report.first_divergent()
    assert (module, row.label) == ("bn1", "bn1.running_var"), format_report(report)


def test_same_padding_at_stride_two_is_named():
    report = diff(torch_conv_bn, nnx_conv_bn_same_padding, dtype="float32")
    module, row = report.first_divergent()
    assert module == "conv2" and row.inputs_agree is True, format_report(report)
