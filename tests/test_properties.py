"""Property-based tests over the op table: shapes, strides, dtypes, parameters and hostile values.

Budget: the "ci" profile (default) runs a few dozen examples per property from a saved example
database; HYPOTHESIS_PROFILE=long runs thousands (see the README).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import host_backends, require, supports
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.extra import numpy as hnp

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS, REQUIRED

BACKENDS = [p.values[0] for p in host_backends() if not p.marks]
ELEMENTWISE = [op for op in OPS if op != "prelu"]

_DB = DirectoryBasedExampleDatabase(str(Path(__file__).parent / "hypothesis-db"))
settings.register_profile(
    "ci", max_examples=25, deadline=None, database=_DB,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, database=_DB, suppress_health_check=list(HealthCheck)
)
settings.load_profile(__import__("os").environ.get("HYPOTHESIS_PROFILE", "ci"))


def _values(dtype):
    fi = np.finfo(dtype)
    specials = [0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 6.0, 0.5, -0.5, float(fi.tiny), float(fi.tiny) / 8,
                float(fi.max), -float(fi.max), np.inf, -np.inf, np.nan]
    return st.one_of(
        st.sampled_from(specials),
        st.floats(-40, 40, width=np.finfo(dtype).bits),
        st.floats(width=np.finfo(dtype).bits, allow_nan=True, allow_infinity=True),
    )


@st.composite
def arrays(draw, dtype):
    """An array of any rank 0-6 (empty dims allowed) as a possibly strided / transposed / flipped view."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=6, min_side=0, max_side=4))
    base = draw(hnp.arrays(dtype, tuple(s * 2 for s in shape), elements=_values(dtype)))
    view = base[(*(slice(None, None, 2) for _ in shape), Ellipsis)]
    if draw(st.booleans()) and view.ndim > 1:
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    if draw(st.booleans()) and view.ndim:
        view = view[::-1]
    return view


@st.composite
def params_for(draw, op, dtype):
    """Valid parameters: defaults, PARAM_CASES, or random values inside each range."""
    spec = OPS[op]
    cases = C.param_cases(spec)
    if cases and draw(st.booleans()):
        return draw(st.sampled_from(cases))
    out = {}
    for p in spec.params:
        if p.kind == "choice":
            out[p.name] = draw(st.sampled_from(p.choices))
        else:
            lo = p.lo if p.lo is not None else -5.0
            v = draw(st.floats(lo, 5.0 if lo < 5 else lo + 5, exclude_min=p.lo_open))
            assume(not (p.nonzero and v == 0))
            out[p.name] = v
    try:
        spec.validate(out)
    except ValueError:
        assume(False)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@given(data=st.data())
def test_every_backend_matches_the_reference(backend, dtype, data):
    require(backend, "relu", "forward", dtype)
    op = data.draw(st.sampled_from(ELEMENTWISE))
    assume(supports(backend, op, "forward", dtype) and supports(backend, op, "backward", dtype))
    spec = OPS[op]
    params = data.draw(params_for(op, dtype))
    x = data.draw(arrays(np.dtype(dtype)))
    dy = np.ones_like(x) * np.asarray(data.draw(st.floats(-4, 4)), dtype=dtype)
    y = ma.forward(op, x, backend=backend, **params)
    assert y.shape == x.shape and y.dtype == x.dtype
    v = C.compare(y, C.reference(spec, "forward", params, dtype, x), x, spec, "forward", params=params)
    assert v.passed, f"{op} {params}: {v.describe()}"
    g = ma.backward(op, dy, x, backend=backend, **params)
    v = C.compare(g, C.reference(spec, "backward", params, dtype, dy, x), x, spec, "backward", scale=dy,
                  params=params)
    assert v.passed, f"{op} grad {params}: {v.describe()}"


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_in_place_equals_out_of_place(backend, data):
    op = data.draw(st.sampled_from(ELEMENTWISE))
    dtype = data.draw(st.sampled_from(["float16", "float32", "float64"]))
    assume(supports(backend, op, "forward", dtype))
    params = data.draw(params_for(op, dtype))
    x = data.draw(arrays(np.dtype(dtype)))
    want = ma.forward(op, x, backend=backend, **params)
    buf = x.copy()
    ma.forward(op, buf, out=buf, backend=backend, **params)
    np.testing.assert_array_equal(buf, want)


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_backward_from_output_matches_its_reference(backend, data):
    ops = [op for op in ELEMENTWISE if OPS[op].backward_y is not None]
    op = data.draw(st.sampled_from(ops))
    spec = OPS[op]
    dtype = data.draw(st.sampled_from(["float16", "float32", "float64"]))
    assume(supports(backend, op, "backward_y", dtype))
    params = data.draw(params_for(op, dtype))
    assume(spec.supports_y(spec.validate(params)))
    rounded = C._rounded(spec, params, dtype)
    if not spec.supports_y(rounded):  # e.g. a slope that is 0 in float32: refused, not guessed
        with pytest.raises(ValueError, match="y= is only supported"):
            ma.backward(op, np.ones(3, dtype), y=np.ones(3, dtype), backend=backend, **params)
        return
    x = data.draw(arrays(np.dtype(dtype)))
    y = ma.forward(op, x, backend=backend, **params)
    dy = np.ones_like(x)
    g = ma.backward(op, dy, y=y, backend=backend, **params)
    ref = C.reference(spec, "backward_y", params, dtype, dy, y)
    v = C.compare(g, ref, y, spec, "backward_y", scale=dy.astype(np.float64) * y)
    assert v.passed, f"{op} {params}: {v.describe()}"
    # piecewise linear: the output determines the slope exactly, unless a bound is not a value of
    # the dtype (then x = the bound's rounding may or may not have been clamped: y cannot tell)
    representable = all(np.asarray(v, dtype).astype(np.float64) == v for v in params.values() if isinstance(v, float))
    if spec.exact and representable:
        np.testing.assert_array_equal(g, ma.backward(op, dy, x, backend=backend, **params))


def _invalid_values(p):
    bad = [np.nan, -np.inf] + ([] if p.inf_ok else [np.inf])
    if p.lo is not None:
        bad.append(p.lo if p.lo_open else p.lo - 1e-3)
    if p.nonzero:
        bad.append(0.0)
    return bad


@given(data=st.data())
def test_invalid_parameters_raise_before_anything_is_written(data):
    op = data.draw(st.sampled_from([op for op in ELEMENTWISE if any(p.kind == "float" for p in OPS[op].params)]))
    spec = OPS[op]
    p = data.draw(st.sampled_from([p for p in spec.params if p.kind == "float"]))
    params = {q.name: (1.0 if q.default is REQUIRED else q.default) for q in spec.params}
    params[p.name] = data.draw(st.sampled_from(_invalid_values(p)))
    x = np.linspace(-2, 2, 16, dtype=np.float32)
    out = np.full_like(x, 7.0)
    with pytest.raises(ValueError, match=p.name):
        ma.forward(op, x, out=out, **params)
    with pytest.raises(ValueError, match=p.name):
        ma.backward(op, x, x, out=out, **params)
    assert np.all(out == 7.0)


# ---- warm calls are cold calls (issue 13) -------------------------------------------------------

_PARAM = st.one_of(
    st.floats(width=64),
    st.sampled_from([0.0, -0.0, 0.2, -0.3, 2.0, 1e300, -1e39, 3.4e38]),
    st.integers(-3, 3),
    st.sampled_from(["none", "tanh", "erf", [0.2], None, np.float32(0.5), np.array(0.25)]),
)
_OUT = st.sampled_from(["none", "fresh", "x", "dy", "readonly", "readonly-x", "overlap", "dy-overlaps-x",
                        "wrong-dtype", "wrong-shape"])


def _attempt(op, direction, dtype, backend, params, values, out_kind):
    """One call on freshly made arrays: ("ok", result bits, input bits) or ("raised", type, message)."""
    buf = np.array(values, dtype=np.float64).astype(dtype)
    n = buf.size - 1
    x, dy = buf[:n].copy(), (buf[1:] * 0.5).astype(dtype)
    out = {
        "none": None, "fresh": np.empty_like(x), "x": x, "dy": dy, "overlap": buf[1:],
        "wrong-dtype": np.empty(n, np.float64 if dtype != "float64" else np.float32),
        "wrong-shape": np.empty(n + 1, dtype), "readonly": np.zeros_like(x),
    }.get(out_kind)
    if out_kind == "readonly-x":
        out = x
    if out_kind in ("readonly", "readonly-x"):
        out.flags.writeable = False
    if out_kind == "overlap":
        x = buf[:-1]
    if out_kind == "dy-overlaps-x":
        dy, x = buf[1:], buf[:-1]
        out = dy
    try:
        # the named functions: they hold the hot path (ma.forward / ma.backward always take the checked one)
        if direction == "forward":
            res = getattr(ma, op)(x, out=out, backend=backend, **params)
        elif direction == "backward":
            res = getattr(ma, f"{op}_grad")(dy, x, out=out, backend=backend, **params)
        else:
            res = getattr(ma, f"{op}_grad")(dy, y=x, out=out, backend=backend, **params)
    except Exception as e:  # noqa: BLE001 - the property compares whatever is raised
        return ("raised", type(e), str(e), buf.tobytes())
    return ("ok", np.asarray(res).tobytes(), x.tobytes(), dy.tobytes(), buf.tobytes())


@given(
    op=st.sampled_from(ELEMENTWISE),
    direction=st.sampled_from(["forward", "backward", "backward_y"]),
    dtype=st.sampled_from(["float16", "float32", "float64"]),
    backend=st.sampled_from([None, *BACKENDS]),
    out_kind=_OUT,
    values=st.lists(_values(np.float16), min_size=2, max_size=24),
    data=st.data(),
)
def test_a_warm_call_behaves_exactly_like_a_cold_one(op, direction, dtype, backend, out_kind, values, data):
    """Raises the same when cold, repeated, and after a good call has filled the cache; or gives the same
    bits each time."""
    from multiact import elementwise, hot

    spec = OPS[op]
    params = {p.name: data.draw(_PARAM, label=p.name) for p in spec.params if data.draw(st.booleans())}
    hot.clear()
    elementwise.clear_validated()
    cold = _attempt(op, direction, dtype, backend, params, values, out_kind)
    again = _attempt(op, direction, dtype, backend, params, values, out_kind)
    _attempt(op, direction, dtype, backend, params, values, "none")  # a good call where one exists
    _attempt(op, direction, dtype, backend, params, values, "fresh")
    warm = _attempt(op, direction, dtype, backend, params, values, out_kind)
    assert cold == again == warm
