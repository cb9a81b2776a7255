"""quant= in multiact.torch (issue 45 item 3): every activation function, the gated functions and bias_act
return torch float8 / int8 codes and their scales, bit for bit multiact.quantize of the float32 result; one
custom op (torch.ops.multiact.quantized) whose fake implementation passes torch.library.opcheck, so
torch.compile keeps one graph and torch.export takes it; errors name the function and the argument."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import multiact as ma  # noqa: E402
import multiact.torch as mt  # noqa: E402
from multiact import consistency as C  # noqa: E402
from multiact.optable import OPS  # noqa: E402
from multiact.torch_quant import quantized  # noqa: E402

QUANTS = [ma.Quant("float8_e4m3fn", "tensor"), ma.Quant("float8_e5m2", "token"),
          ma.Quant("int8", "group", group_size=32, symmetric=False), ma.Quant("float8_e4m3fn", "mx", rule="floor")]


def _x(dtype=torch.bfloat16) -> torch.Tensor:
    x = torch.linspace(-8, 8, 256).reshape(4, 64)
    x[1] = 0.0
    x[2, :3] = torch.tensor([float("nan"), float("inf"), -1e5])
    return x.to(dtype)


def _same(got: tuple, want: tuple) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = g.contiguous()
        gb = g.view(torch.uint8).numpy() if g.element_size() == 1 else g.view(torch.int32).numpy()
        w = np.ascontiguousarray(w)
        np.testing.assert_array_equal(gb, w.view(np.uint8) if w.itemsize == 1 else w.view(np.int32))


def _args(spec, x: torch.Tensor) -> tuple[dict, dict]:
    """The op's last parameter case for mt (a tensor weight for an array parameter) and for ma (float32)."""
    p = dict(C.param_cases(spec)[-1])
    array = spec.defn.array_param
    if not array:
        return p, p
    w = torch.from_numpy(C.prelu_weight(x.float().numpy(), p[array], p.get("axis", 1))).to(x.dtype)
    return {**p, array: w}, {**p, array: w.float().numpy()}


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_function_quantizes_its_float32_result(name):
    spec = OPS[name]
    x = _x()
    pt, pn = _args(spec, x)
    want_y = ma.forward(name, x.float().numpy(), **pn)
    for q in QUANTS:
        _same(getattr(mt, name)(x, **pt, quant=q), ma.quantize(want_y, q))


def test_gated_and_bias_act_quantize_their_float32_result():
    x, b = _x(torch.float16), torch.linspace(-1, 1, 64, dtype=torch.float16)
    for q in QUANTS:
        _same(mt.swiglu(x, quant=q), ma.quantize(ma.swiglu(x.float().numpy()), q))
        _same(mt.geglu(x, up=x, approximate="tanh", quant=q),
              ma.quantize(ma.geglu(x.float().numpy(), up=x.float().numpy(), approximate="tanh"), q))
        _same(mt.glu(x, act="leaky_relu", negative_slope=0.2, quant=q),
              ma.quantize(ma.glu(x.float().numpy(), act="leaky_relu", negative_slope=0.2), q))
        _same(mt.bias_act(x, b, "gelu", dim=1, gain=2.0, quant=q),
              ma.quantize(ma.bias_act(x.float().numpy(), b.float().numpy(), "gelu", dim=1, gain=2.0), q))


def test_the_op_passes_opcheck_and_compiles_to_one_graph():
    """opcheck (schema, fake against real, dispatch) on each granularity; torch.compile(fullgraph=True) and
    torch.export give the eager bits (NaN codes included)."""
    from multiact.torch_quant import encode

    x = torch.linspace(-8, 8, 256).reshape(4, 64)  # no NaN: opcheck compares with assert_close
    for q in QUANTS:
        torch.library.opcheck(quantized, (x, None, None, encode("silu", (), {}, None, q, "t")))
        torch.library.opcheck(quantized, (x, x, None, encode("swiglu", ("up",), {}, None, q, "t")))
    q, x = QUANTS[2], _x(torch.float32)
    f = torch.compile(lambda t: mt.gelu(t, approximate="tanh", quant=q), fullgraph=True, backend="eager")
    _same(f(x), ma.quantize(ma.gelu(x.numpy(), approximate="tanh"), q))

    class Model(torch.nn.Module):
        def forward(self, t):
            return mt.swiglu(t, quant=ma.Quant("float8_e4m3fn", "mx"))

    ep = torch.export.export(Model(), (x,))
    assert any(n.target is torch.ops.multiact.quantized.default for n in ep.graph.nodes)
    _same(ep.module()(x), ma.quantize(ma.swiglu(x.numpy()), ma.Quant("float8_e4m3fn", "mx")))


def test_errors_name_the_function_and_the_argument():
    x = _x(torch.float32)
    q = QUANTS[0]
    with pytest.raises(TypeError, match=r"multiact.torch.relu\(\): inplace=True cannot be combined with quant="):
        mt.relu(x, inplace=True, quant=q)
    with pytest.raises(TypeError, match=r"multiact.torch.gelu\(\): quant must be a multiact.Quant"):
        mt.gelu(x, quant="float8_e4m3fn")
    with pytest.raises(TypeError, match=r"multiact.torch.swish\(\): with quant=, beta must be a number or str"):
        mt.swish(x, torch.tensor(1.5), quant=q)
    with pytest.raises(ValueError, match=r"the last axis \(48\) must be a multiple of the group size"):
        mt.silu(x[:, :48], quant=ma.Quant("int8", "group", group_size=32))
    codes, _ = mt.silu(x.clone().requires_grad_(), quant=q)
    assert not codes.requires_grad  # codes carry no gradient
    got = mt.leaky_relu(x, np.float32(0.2), quant=q)  # a NumPy scalar parameter is its value
    _same(got, ma.quantize(ma.leaky_relu(x.numpy(), np.float32(0.2)), q))
