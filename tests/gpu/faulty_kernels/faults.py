"""Kernels that misbehave on request, so the GPU suite can check that a fault on the GPU
surfaces as a Python error naming the kernel, never as a silent wrong answer.

Each takes a runtime scalar that chooses: with 0 it computes a checkable result, otherwise
it faults. Built by tests/gpu/faulty_kernels/kernels.toml.
"""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm


def _index() -> cutlass.Int32:
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    return bidx * bdim + tidx


@cute.kernel
def _shifted_copy_kernel(x: cute.Tensor, out: cute.Tensor, shift: cutlass.Int64, n: cutlass.Int32):
    i = _index()
    if i < n:
        # Pointer arithmetic in 64 bits: a shift of 1 << 40 elements reads 4 TiB past x,
        # far outside anything XLA's allocator has mapped.
        src = cute.make_tensor(x.iterator + shift, x.layout)
        out[i] = src[i]


@cute.jit
def shifted_copy(x: cute.Tensor, out: cute.Tensor, shift: cutlass.Int64, stream,
                 threads: cutlass.Constexpr = 128):
    """out[i] = x[i + shift]: a copy for shift 0, an out-of-bounds read for a large shift."""
    n = x.shape[0]
    _shifted_copy_kernel(x, out, shift, n).launch(
        grid=[(n + threads - 1) // threads, 1, 1], block=[threads, 1, 1], stream=stream)


@cute.kernel
def _doubled_or_trap_kernel(x: cute.Tensor, out: cute.Tensor, trap: cutlass.Int32, n: cutlass.Int32):
    i = _index()
    if i < n:
        out[i] = x[i] * 2.0
    if trap != 0:
        llvm.inline_asm(None, [], "trap;", "", has_side_effects=True)  # PTX `trap`: abort the kernel


@cute.jit
def doubled_or_trap(x: cute.Tensor, out: cute.Tensor, trap: cutlass.Int32, stream):
    """out = 2 * x, then, if `trap` is not 0, every thread executes PTX `trap`."""
    n = x.shape[0]
    _doubled_or_trap_kernel(x, out, trap, n).launch(
        grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)


@cute.kernel
def _copy_kernel(x: cute.Tensor, out: cute.Tensor, n: cutlass.Int32):
    i = _index()
    if i < n:
        out[i] = x[i]


@cute.jit
def copy(x: cute.Tensor, out: cute.Tensor, stream):
    """out = x: built only for GPUs other than the test machine's (the arch-mismatch case)."""
    n = x.shape[0]
    _copy_kernel(x, out, n).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)


@cute.kernel
def _tuned_copy_kernel(x: cute.Tensor, out: cute.Tensor, n: cutlass.Int32, mode: cutlass.Constexpr):
    i = _index()
    if i < n:
        if cutlass.const_expr(mode == 1):
            out[i] = x[i] + 1.0  # a wrong candidate: disagrees with the default
        else:
            out[i] = x[i]
    if cutlass.const_expr(mode == 2):
        llvm.inline_asm(None, [], "trap;", "", has_side_effects=True)  # a faulting candidate


@cute.jit
def tuned_copy(x: cute.Tensor, out: cute.Tensor, stream, mode: cutlass.Constexpr = 0):
    """out = x for mode 0; mode 1 computes a wrong result, mode 2 traps, mode 3 fails to
    compile (for `cutecc tune`)."""
    if cutlass.const_expr(mode == 3):
        raise ValueError("mode 3 refuses to compile (a tuning candidate the kernel's code rejects)")
    n = x.shape[0]
    _tuned_copy_kernel(x, out, n, mode).launch(
        grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)
