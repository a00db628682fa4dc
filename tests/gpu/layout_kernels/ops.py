"""Kernels for tests/gpu/test_layouts_gpu.py: declared layouts, divisibility and call keywords."""

import cutlass
import cutlass.cute as cute


@cute.kernel
def _rows(x: cute.Tensor, y: cute.Tensor, vec: cutlass.Constexpr):
    b, _, _ = cute.arch.block_idx()
    t, _, _ = cute.arch.thread_idx()
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), x.element_type, num_bits_per_copy=128)
    cute.copy(atom, cute.zipped_divide(x, (1, vec))[(None, (b, t))],
              cute.zipped_divide(y, (1, vec))[(None, (b, t))])


@cute.jit
def copy_rows(x: cute.Tensor, y: cute.Tensor, stream):
    """y = x with one 128-bit copy per thread along each row (n a multiple of 8 bf16)."""
    vec = 128 // x.element_type.width
    _rows(x, y, vec).launch(grid=(cute.size(x, mode=[0]), 1, 1),
                            block=(cute.size(x, mode=[1]) // vec, 1, 1), stream=stream)


@cute.kernel
def _cols(x: cute.Tensor, y: cute.Tensor, vec: cutlass.Constexpr):
    b, _, _ = cute.arch.block_idx()
    t, _, _ = cute.arch.thread_idx()
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), x.element_type, num_bits_per_copy=128)
    cute.copy(atom, cute.zipped_divide(x, (vec, 1))[(None, (t, b))],
              cute.zipped_divide(y, (vec, 1))[(None, (t, b))])


@cute.jit
def copy_cols(x: cute.Tensor, y: cute.Tensor, stream):
    """y = x for column-major x and y, one 128-bit copy per thread down each column."""
    vec = 128 // x.element_type.width
    _cols(x, y, vec).launch(grid=(cute.size(x, mode=[1]), 1, 1),
                            block=(cute.size(x, mode=[0]) // vec, 1, 1), stream=stream)


@cute.kernel
def _scale(x: cute.Tensor, out: cute.Tensor, f: cutlass.Constexpr):
    b, _, _ = cute.arch.block_idx()
    t, _, _ = cute.arch.thread_idx()
    i = b * 128 + t
    if i < cute.size(x):
        out[i] = x[i] * f  # the same logical coordinate in both, whatever their layouts


@cute.jit
def scale(x: cute.Tensor, out: cute.Tensor, stream, causal: cutlass.Constexpr = False):
    """out = x * (2 if causal else 1), element by logical coordinate."""
    n = cute.size(x)
    _scale(x, out, 2.0 if causal else 1.0).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1],
                                                  stream=stream)


@cute.jit
def scale_bwd(x: cute.Tensor, ct: cute.Tensor, dx: cute.Tensor, stream,
              causal: cutlass.Constexpr = False):
    n = cute.size(x)
    _scale(ct, dx, 2.0 if causal else 1.0).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1],
                                                   stream=stream)


@cute.kernel
def _row_dot(a: cute.Tensor, v: cute.Tensor, out: cute.Tensor):
    b, _, _ = cute.arch.block_idx()
    t, _, _ = cute.arch.thread_idx()
    i = b * 128 + t
    if i < cute.size(a, mode=[0]):
        acc = cutlass.Float32(0.0)
        for j in range(cute.size(a, mode=[1])):
            acc += a[i, j] * v[j]
        out[i] = acc


@cute.jit
def row_dot(a: cute.Tensor, v: cute.Tensor, out: cute.Tensor, stream):
    """out[i] = sum over j < k of a[i, j] * v[j]: a is the (m, k) block of a padded buffer."""
    m = cute.size(a, mode=[0])
    _row_dot(a, v, out).launch(grid=[(m + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)


@cute.kernel
def _gemm_mkl(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor):
    i, by, batch = cute.arch.block_idx()
    t, _, _ = cute.arch.thread_idx()
    j = by * 128 + t
    if j < cute.size(c, mode=[1]):
        acc = cutlass.Float32(0.0)
        for kk in range(cute.size(a, mode=[1])):
            acc += a[i, kk, batch] * b[j, kk, batch]
        c[i, j, batch] = acc


@cute.jit
def gemm_mkl(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
    """c[m, n, l] = sum over k of a[m, k, l] * b[n, k, l]: cutlass_call's GEMM modes, A as
    [M][K][L], B as [N][K][L], C as [M][N][L], whatever strides the views have."""
    m = cute.size(c, mode=[0])
    n = cute.size(c, mode=[1])
    batches = cute.size(c, mode=[2])
    _gemm_mkl(a, b, c).launch(grid=[m, (n + 127) // 128, batches], block=[128, 1, 1], stream=stream)


@cute.kernel
def _apply(x: cute.Tensor, y: cute.Tensor, out: cute.Tensor, op: cutlass.Constexpr):
    b, _, _ = cute.arch.block_idx()
    t, _, _ = cute.arch.thread_idx()
    i = b * 128 + t
    if i < cute.size(x):
        out[i] = op(x[i], y[i])


@cute.jit
def apply_op(x: cute.Tensor, y: cute.Tensor, out: cute.Tensor, stream, op: cutlass.Constexpr = None):
    """out = op(x, y) elementwise, `op` a Python callable (NVIDIA's elementwise-apply form)."""
    _apply(x, y, out, op).launch(grid=((cute.size(x) + 127) // 128, 1, 1), block=(128, 1, 1),
                                 stream=stream)


@cute.kernel
def _unit(x: cute.Tensor, y: cute.Tensor):
    b, _, _ = cute.arch.block_idx()
    t, _, _ = cute.arch.thread_idx()
    i = b * 128 + t
    if i < cute.size(x, mode=[1]):
        y[0, i] = x[0, i] * 2.0


@cute.jit
def double_unit(x: cute.Tensor, y: cute.Tensor, stream):
    """y = 2 x for (1, n) arrays, x compiled with stride 0 on its extent-1 dimension."""
    _unit(x, y).launch(grid=((cute.size(x, mode=[1]) + 127) // 128, 1, 1), block=(128, 1, 1),
                       stream=stream)
