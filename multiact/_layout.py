"""Memory-layout helpers shared by the CPU backends."""

from __future__ import annotations

import numpy as np


def flat_views(*arrays: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """1-D views in memory order when every array is contiguous in the same order, else None.

    Kernels that stream over flat memory use these directly; otherwise they copy.
    """
    if all(a.flags.c_contiguous for a in arrays):
        return tuple(a.reshape(-1) for a in arrays)
    if all(a.flags.f_contiguous for a in arrays):
        return tuple(a.reshape(-1, order="F") for a in arrays)
    return None


def coalesce(shape: tuple[int, ...], strides: list, lead: int = -1) -> tuple[list[int], list[list[int]]]:
    """(shape, per-operand strides) with unit dims dropped, dims ordered by operand `lead`'s strides, and
    neighbouring dims merged where every operand's strides allow: the fewest loops that visit the
    operands' elements (strides in any unit, one list per operand)."""
    dims = [i for i, n in enumerate(shape) if n != 1]
    dims.sort(key=lambda i: -abs(strides[lead][i]))
    shp = [shape[i] for i in dims]
    sts = [[s[i] for i in dims] for s in strides]
    k = len(shp) - 1
    while k > 0:
        if all(st[k - 1] == st[k] * shp[k] for st in sts):
            shp[k - 1] *= shp[k]
            del shp[k]
            for st in sts:
                st[k - 1] = st[k]
                del st[k]
        k -= 1
    return shp, sts


def reshaped(a: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """A view of destination `a` with `shape` (True), or a scratch array of that shape to copy back into `a`
    (False) where no view exists (a reshape would copy)."""
    if a.shape == tuple(shape):
        return a, True
    try:
        v = a.view()
        v.shape = shape  # raises where a reshape would copy
        return v, True
    except AttributeError:
        return np.empty(shape, a.dtype), False
