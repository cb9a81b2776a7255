"""Backend modules, one per way of running the kernels; see multiact.registry.

Importing a submodule sets the attribute `multiact.backends` to this package,
which would hide the function `ma.backends()`; so the package itself is
callable and answers as that function does.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self):
        from multiact.registry import backends

        return backends()


sys.modules[__name__].__class__ = _CallablePackage
