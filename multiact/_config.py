"""Process-wide settings that CPU backends read per call: the thread count."""

from __future__ import annotations

import os

_threads: int | None = None  # also read by the C hot path (multiact._hotpath), which calls get_num_threads if None
# Beyond any machine's cores, and far inside a C int: a larger count is a mistake, refused up front
# rather than by every native call afterwards.
MAX_THREADS = 1 << 16


def _default_threads() -> int:
    env = os.environ.get("MULTIACT_NUM_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"MULTIACT_NUM_THREADS must be a positive integer, got {env!r}") from None
        if not 1 <= n <= MAX_THREADS:
            raise ValueError(f"MULTIACT_NUM_THREADS must be an integer from 1 to {MAX_THREADS}, got {env!r}")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def set_num_threads(n: int) -> None:
    """Threads that CPU backends may use for one large call (small calls stay single-threaded)."""
    global _threads
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise ValueError(f"set_num_threads(): n must be an int from 1 to {MAX_THREADS}, got {n!r}")
    _threads = n


def get_num_threads() -> int:
    """The thread budget: set_num_threads(), else MULTIACT_NUM_THREADS, else the usable CPUs."""
    global _threads
    if _threads is None:
        _threads = _default_threads()
    return _threads
