"""Only here because pyproject.toml has no key for cffi_modules."""
import os

from setuptools import setup

_BUILDER = "native/build_native.py"
setup(cffi_modules=[_BUILDER + ":ffibuilder"] if os.path.exists(_BUILDER) else [])
