"""In-place AXPY with optional bias in CuTe DSL: y = alpha * x + y (+ bias).

Math is done in Float32 and rounded once to the tensor dtype. Each thread
handles ``vec`` contiguous elements (one 128-bit access); the partial chunk at
the end of the tensor is handled with predicated scalar accesses.
"""

import cutlass
import cutlass.cute as cute


@cute.kernel
def _axpy_kernel(alpha: cutlass.Float32, x: cute.Tensor, y: cute.Tensor, bias,
                 threads: cutlass.Constexpr, vec: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = cute.size(y, mode=[0])
    t = bidx * threads + tidx
    base = t * vec
    if base + vec <= n:
        gx = cute.zipped_divide(x, (vec,))
        gy = cute.zipped_divide(y, (vec,))
        r = gx[(None, t)].load().to(cutlass.Float32) * alpha + gy[(None, t)].load().to(cutlass.Float32)
        if cutlass.const_expr(bias is not None):
            gb = cute.zipped_divide(bias, (vec,))
            r = r + gb[(None, t)].load().to(cutlass.Float32)
        gy[(None, t)].store(r.to(y.element_type))
    elif base < n:
        for k in cutlass.range_constexpr(vec):
            i = base + k
            if i < n:
                s = x[i].to(cutlass.Float32) * alpha + y[i].to(cutlass.Float32)
                if cutlass.const_expr(bias is not None):
                    s = s + bias[i].to(cutlass.Float32)
                y[i] = s.to(y.element_type)


def _check(x, y, bias):
    dt = y.element_type
    ts = (x, y) if bias is None else (x, y, bias)
    for t in ts:
        if cute.rank(t.layout) != 1:
            raise TypeError("axpy_: expected 1-D tensors")
        if t.element_type != dt:
            raise TypeError("axpy_: x, y (and bias) must share one dtype")
    return max(1, 128 // dt.width)


@cute.jit
def axpy_(stream, alpha: cutlass.Float32, x: cute.Tensor, y: cute.Tensor, bias,
          threads: cutlass.Constexpr = 256):
    """In place: y[i] = alpha * x[i] + y[i] (+ bias[i]); 1-D, length n, f32/f16/bf16.

    ``bias`` is a tensor or ``None``; the choice is fixed at compile time.
    """
    vec = _check(x, y, bias)
    n = cute.size(y, mode=[0])
    per_block = threads * vec
    grid = (n + per_block - 1) // per_block
    _axpy_kernel(alpha, x, y, bias, threads, vec).launch(
        grid=[grid, 1, 1], block=[threads, 1, 1], stream=stream)
