"""Only here because pyproject.toml has no key for cffi_modules, for a build that uses every core, and for the
optional C hot path.

The extensions: multiact._native (cffi, native/build_native.py: the kernels) and multiact._hotpath
(native/hotpath/hotpath.c: the hot path of the generated functions, against NumPy's C API; optional: where it
cannot be built, multiact's Python hot path does the same).  MULTIACT_BUILD_ONLY=hotpath builds only the latter
(`MULTIACT_BUILD_ONLY=hotpath python setup.py build_ext --inplace`: seconds, where the kernels take minutes).
"""
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_BUILDER = "native/build_native.py"
_HOTPATH = "native/hotpath/hotpath.c"
_ONLY = os.environ.get("MULTIACT_BUILD_ONLY", "").strip()


def _hotpath() -> list:
    """multiact._hotpath, where NumPy's headers are there to build it against (pyproject's build requires)."""
    if not os.path.exists(_HOTPATH):
        return []
    try:
        import numpy
    except ImportError:
        print("multiact: NumPy is not importable at build time: multiact._hotpath is not built (the Python hot path "
              "does its work)")
        return []
    return [Extension("multiact._hotpath", [_HOTPATH], include_dirs=[numpy.get_include()], optional=True,
                      extra_compile_args=["-O2"] if os.name == "posix" else [])]


class ParallelBuildExt(build_ext):
    """Compiles an extension's C sources in parallel (the native kernels are split into one translation
    unit per ISA and part for this); MULTIACT_BUILD_JOBS sets the number of compilers (default: the CPUs)."""

    def build_extension(self, ext):
        jobs = int(os.environ.get("MULTIACT_BUILD_JOBS") or os.cpu_count() or 1)
        compiler = self.compiler

        def compile_parallel(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                             extra_preargs=None, extra_postargs=None, depends=None):
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

            def one(obj):
                if obj in build:
                    src, ext_ = build[obj]
                    compiler._compile(obj, src, ext_, cc_args, extra_postargs, pp_opts)

            with ThreadPoolExecutor(max(1, jobs)) as pool:
                list(pool.map(one, objects))
            return objects

        compiler.compile = compile_parallel
        super().build_extension(ext)


setup(
    cffi_modules=[_BUILDER + ":ffibuilder"] if os.path.exists(_BUILDER) and _ONLY != "hotpath" else [],
    ext_modules=_hotpath(),
    cmdclass={"build_ext": ParallelBuildExt},
)
