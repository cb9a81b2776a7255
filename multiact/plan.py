"""A call described once, as a family hands it to the call core (multiact.core).

A family (the elementwise ops, the gated ops, bias_act) turns its caller's arguments into a `Plan`: the
kernel key, direction and checked parameters, the caller's arrays by name, its `out`, and itself (the
`Family` that knows how those arrays become a kernel's views).  The core carries out every plan the same
way for every array kind: checks, backend resolution, allocation, run, write marks, wrapping; Dask runs a
plan blockwise.  Nothing here depends on which family or which op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Result:
    """One array a call returns or writes: its name in errors ("out", "out[1]"), the array whose dtype (and,
    unless `shape` is given, shape) it takes, and how it is made.

    kernel=True: the kernel writes it (into a destination the caller gave, or one allocated here);
    kernel=False: the family computes it after the kernel (a sum) and the core copies it into a destination.
    `axes`: for a sum, the axes of the family's first array it keeps (the others are summed over): how Dask
    adds its chunks' float64 partials before `finish` rounds the total once."""

    __slots__ = ("name", "like", "shape", "kernel", "axes", "finish")

    def __init__(self, name: str, like: Any, shape: tuple[int, ...] | None = None, *, kernel: bool = True,
                 axes: tuple[int, ...] | None = None, finish: Callable[[Any], Any] | None = None):
        self.name, self.like, self.kernel, self.axes, self.finish = name, like, kernel, axes, finish
        self.shape = tuple(like.shape) if shape is None else shape

    @property
    def dtype(self) -> Any:
        return self.like.dtype


class Job:
    """A plan made concrete on arrays of one kind: the dtype the kernel runs in, the results (None where a
    position of the return has no array), the kernel's parameters, and `run(kernel, arrays)`, which calls
    `kernel(*args, p)` on the family's views of the inputs and of the results' arrays and returns the
    values of the results that are not the kernel's (sums), by position."""

    __slots__ = ("dtype", "results", "p", "run")

    def __init__(self, dtype: Any, results: tuple[Result | None, ...], p: dict,
                 run: Callable[[Callable[..., Any], list], dict[int, Any]]):
        self.dtype, self.results, self.p, self.run = dtype, results, p, run


class Family(Protocol):
    """What a family gives the core for its plans: which arrays may be None, whether host arrays beside a Dask
    array join it, what to say of masked arrays (None: computed on their data), and the methods below."""

    optional: frozenset[str]
    join_dask: bool
    masked: str | None

    def host(self, plan: Plan, arrays: dict[str, Any]) -> Job:
        """The job on NumPy views of the caller's arrays (its shapes checked, with errors naming them)."""

    def device(self, plan: Plan, arrays: dict[str, Any]) -> Job:
        """The job on device arrays as they are."""

    def check(self, plan: Plan, dtype: Any) -> None:
        """The parameters fit the dtype the kernel computes in (ValueError naming them)."""

    def outs(self, plan: Plan) -> tuple[Any, ...]:
        """The caller's destinations by result position (() for none given); TypeError for a wrong form."""

    def returned(self, plan: Plan, values: list[Any]) -> Any:
        """What the call returns from its results' values (no out given)."""

    def blocks(self, plan: Plan, arrays: dict[str, Any]) -> Blocks:
        """How Dask runs the plan chunk by chunk."""


class Blocks:
    """A plan as Dask runs it: the blockwise arguments (each an array with its index labels, or a constant with
    None), the index of the results' blocks, per-label chunk changes, whether a block gets whole axes
    (concatenate), and `rebuild(blocks) -> Plan`, the plan of one chunk (a picklable function of plain values:
    chunks may run in other processes).  `results` are the plan's results on the whole arrays (for the sums:
    their axes and finish)."""

    __slots__ = ("args", "index", "adjust", "concatenate", "rebuild", "results", "like")

    def __init__(self, args: list[tuple[Any, tuple | None]], index: tuple, rebuild: Callable[..., Plan],
                 results: tuple[Result | None, ...], like: Any, adjust: dict | None = None,
                 concatenate: bool = False):
        self.args, self.index, self.rebuild, self.results, self.like = args, index, rebuild, results, like
        self.adjust, self.concatenate = adjust or {}, concatenate


class Plan:
    """One call: the function the user called (`fn`, for errors), what the kernel is (`key`, `direction`,
    checked parameters `p`), the caller's arrays by name (the first decides the result's kind; None for
    an optional one not given), its `out`, its `backend=`, and the family that arranges it.  `what` names
    the call in a note on a kernel's error; `state` is the family's own (an op's spec, a checked call);
    `partial` asks for float64 partial sums (a Dask chunk); `cache`, where the family keeps a hot path, is
    where a plain call is remembered (multiact.hot); `quant`, on a forward, asks for its result quantized;
    `dequant`, on a forward, reads an int32 x through its scales."""

    __slots__ = ("fn", "what", "key", "direction", "p", "arrays", "out", "backend", "family", "state", "partial",
                 "cache", "quant", "dequant")

    def __init__(self, fn: str, what: str, key: str, direction: str, p: dict, arrays: dict[str, Any], out: Any,
                 backend: str | None, family: Family, state: Any = None, partial: bool = False):
        self.fn, self.what, self.key, self.direction, self.p = fn, what, key, direction, p
        self.arrays, self.out, self.backend, self.family, self.state = arrays, out, backend, family, state
        self.partial = partial
        self.cache: tuple[dict, tuple] | None = None  # (the hot path's table, the parameters' key terms)
        self.quant: Any = None  # a multiact.Quant: the forward's result quantized (multiact.quant's contract)
        self.dequant: Any = None  # a multiact.Dequant: x is int32, dequantized first (multiact.dequant's contract)
