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
