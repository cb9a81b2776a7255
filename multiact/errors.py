"""Exceptions of multiact's own (bad input raises the builtin TypeError / ValueError)."""


class BackendError(RuntimeError):
    """A backend that was asked for cannot run this call: unavailable, or lacks the op/dtype."""
