"""Exceptions of multiact's own (bad input raises the builtin TypeError / ValueError)."""


class BackendError(RuntimeError):
    """A backend that was asked for cannot run this call: unavailable, or lacks the op/dtype."""


class YFormError(TypeError, ValueError):
    """y= given to a backward whose derivative needs the input x.

    A TypeError (an argument the function cannot take, as Python says of an unknown keyword) and a
    ValueError (what ma.backward raised before), as NumPy's AxisError is both ValueError and IndexError.
    """
