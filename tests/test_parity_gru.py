"""torch.nn.GRU (two layers, inside an embedding -> GRU -> Linear tagger) ported to Flax NNX with
the parity toolkit (tests/parity_ports.py): weights EXACT, every module's output and every
parameter's gradient within FLOAT32 and FLOAT64, three SGD-with-momentum steps within FLOAT64,
and a GRU of the other kind (reset gate before the hidden matmul) named by the diff:

    python -m parity diff tests.test_parity_gru:torch_tagger tests.test_parity_gru:nnx_tagger
"""

from __future__ import annotations

import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from parity.check import format_report  # noqa: E402
from parity.diff import diff  # noqa: E402
from parity.keymap import load_torch, param_dtype  # noqa: E402
from parity.steps import SGD, compare_steps  # noqa: E402
from tests.parity_ports import Tagger  # noqa: E402

VOCAB, DIM, HIDDEN, LAYERS, OUT = 20, 8, 12, 2, 5


class TorchTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.gru = torch.nn.GRU(DIM, HIDDEN, LAYERS, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, ids):
        y, _ = self.gru(self.embed(ids))
        return self.head(y)


def torch_tagger():
    """TORCH_FACTORY: the tagger with seeded weights, a batch of 3 sequences of 9 tokens."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    return TorchTagger(), (ids,)


def nnx_tagger(torch_module, **gru):
    port = Tagger(
        VOCAB, DIM, HIDDEN, LAYERS, OUT, param_dtype=param_dtype(torch_module), gru=gru,
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    return load_torch(port, torch_module)


def nnx_tagger_reset_before(torch_module):
    """Wrong on purpose: n = tanh(W_in x + b_in + W_hn (r * h) + b_hn), the GRU of the original
    paper, where torch applies r after the hidden matmul (b_hn inside)."""
    return nnx_tagger(torch_module, reset_after=False)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_port_agrees_with_gradients(dtype):
    report = diff(torch_tagger, nnx_tagger, dtype=dtype, grads=True)
    assert report.passed, format_report(report)
    assert [r.label for r in report.section("outputs")] == ["embed", "gru", "head", "(root)"]
    assert len(report.section("grads")) == 1 + 4 * LAYERS + 2


def test_three_sgd_momentum_steps_match_torch_float64(x64):
    module, (ids,) = torch_tagger()
    module = module.double()
    report = compare_steps(module, nnx_tagger(module), (ids,), SGD(0.1, momentum=0.9), steps=3)
    assert report.passed, format_report(report)


def test_reset_gate_before_the_matmul_is_named():
    report = diff(torch_tagger, nnx_tagger_reset_before, dtype="float32")
    module, row = report.first_divergent()
    assert module == "gru" and row.inputs_agree is True, format_report(report)
