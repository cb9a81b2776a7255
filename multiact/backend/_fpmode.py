"""The floating-point mode of the calling thread, for numba's parallel loops.

A thread's flush-to-zero, denormals-are-zero and rounding bits (x86 MXCSR; aarch64 FPCR) are its own: after
`torch.set_flush_denormal(True)` in the caller, numba's worker threads still compute in the mode they started
with, so a subnormal result would depend on which thread computed it.  A parallel loop reads the caller's mode
with `fp_get()` before its `prange` (that code runs on the calling thread) and each block adopts it with
`fp_adopt(mode)` (the native backend's pool does the same in C: native/src/ma_pool.c).  Elsewhere (another
architecture) both are no-ops: `FOLLOWS` says which.
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_ARCH = platform.machine().lower()
_X86 = _ARCH in ("x86_64", "amd64", "i386", "i686")
_ARM64 = _ARCH in ("aarch64", "arm64")
# The bits that follow the caller: x86 MXCSR FTZ (15), rounding (13-14), DAZ (6); aarch64 FPCR FZ (24),
# rounding (22-23), FZ16 (19) (native/src/ma_pool.c's FP_MODE_BITS).
BITS = 0xE040 if _X86 else ((1 << 24) | (3 << 22) | (1 << 19)) if _ARM64 else 0
FOLLOWS = bool(BITS)

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _read(builder: ir.IRBuilder) -> ir.Value:
    """The thread's mode register as a 64-bit integer (0 where there is none)."""
    mod = builder.module
    if _X86:
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), [i8p]), "llvm.x86.sse.stmxcsr")
        slot = cgutils.alloca_once(builder, _I32)
        builder.call(fn, [builder.bitcast(slot, i8p)])
        return builder.zext(builder.load(slot), _I64)
    if _ARM64:
        fn = cgutils.get_or_insert_function(mod, ir.FunctionType(_I64, []), "llvm.aarch64.get.fpcr")
        return builder.call(fn, [])
    return ir.Constant(_I64, 0)


def _write(builder: ir.IRBuilder, value: ir.Value) -> None:
    mod = builder.module
    if _X86:
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), [i8p]), "llvm.x86.sse.ldmxcsr")
        slot = cgutils.alloca_once(builder, _I32)
        builder.store(builder.trunc(value, _I32), slot)
        builder.call(fn, [builder.bitcast(slot, i8p)])
    elif _ARM64:
        fn = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), [_I64]), "llvm.aarch64.set.fpcr")
        builder.call(fn, [value])


@intrinsic
def fp_get(typingctx):
    """The calling thread's mode bits (BITS of its mode register)."""

    def codegen(context, builder, signature, args):
        return builder.and_(_read(builder), ir.Constant(_I64, BITS))

    return types.int64(), codegen


@intrinsic
def fp_adopt(typingctx, mode):
    """Set this thread's mode bits to `mode`'s (the others kept), writing the register only if they differ."""
    if not isinstance(mode, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        want = builder.and_(builder.sext(args[0], _I64) if args[0].type.width < 64 else args[0],
                            ir.Constant(_I64, BITS))
        now = _read(builder)
        nxt = builder.or_(builder.and_(now, ir.Constant(_I64, ~BITS & 0xFFFFFFFFFFFFFFFF)), want)
        with builder.if_then(builder.icmp_unsigned("!=", nxt, now), likely=False):
            _write(builder, nxt)
        return context.get_dummy_value()

    return types.void(mode), codegen
