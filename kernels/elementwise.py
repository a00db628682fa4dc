"""Elementwise multiply (forward and backward) in CuTe DSL.

Each thread handles ``vec`` contiguous elements, where ``vec`` makes one
128-bit access (4 x f32, 8 x f16/bf16). Full chunks use vector loads/stores;
the single partial chunk at the tail of the tensor falls back to predicated
scalar accesses, so any runtime length n >= 1 is handled.
"""

import cutlass
import cutlass.cute as cute


def _vec_width(dtype) -> int:
    """Elements per 128-bit access for ``dtype``."""
    return max(1, 128 // dtype.width)


@cute.kernel
def _mul_kernel(x: cute.Tensor, y: cute.Tensor, out: cute.Tensor,
                threads: cutlass.Constexpr, vec: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = cute.size(x, mode=[0])
    t = bidx * threads + tidx          # chunk index
    base = t * vec                     # first element of this thread's chunk
    if base + vec <= n:
        gx = cute.zipped_divide(x, (vec,))
        gy = cute.zipped_divide(y, (vec,))
        go = cute.zipped_divide(out, (vec,))
        go[(None, t)].store(gx[(None, t)].load() * gy[(None, t)].load())
    elif base < n:
        for k in cutlass.range_constexpr(vec):
            if base + k < n:
                out[base + k] = x[base + k] * y[base + k]


@cute.kernel
def _mul_bwd_kernel(x: cute.Tensor, y: cute.Tensor, dout: cute.Tensor,
                    dx: cute.Tensor, dy: cute.Tensor,
                    threads: cutlass.Constexpr, vec: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = cute.size(x, mode=[0])
    t = bidx * threads + tidx
    base = t * vec
    if base + vec <= n:
        gx = cute.zipped_divide(x, (vec,))
        gy = cute.zipped_divide(y, (vec,))
        gdo = cute.zipped_divide(dout, (vec,))
        gdx = cute.zipped_divide(dx, (vec,))
        gdy = cute.zipped_divide(dy, (vec,))
        g = gdo[(None, t)].load()
        gdx[(None, t)].store(g * gy[(None, t)].load())
        gdy[(None, t)].store(g * gx[(None, t)].load())
    elif base < n:
        for k in cutlass.range_constexpr(vec):
            if base + k < n:
                g = dout[base + k]
                dx[base + k] = g * y[base + k]
                dy[base + k] = g * x[base + k]


def _check_1d(name, *tensors):
    dt = tensors[0].element_type
    for t in tensors:
        if cute.rank(t.layout) != 1:
            raise TypeError(f"{name}: expected 1-D tensors")
        if t.element_type != dt:
            raise TypeError(f"{name}: all tensors must share one dtype")
    return dt


@cute.jit
def mul(stream, x: cute.Tensor, y: cute.Tensor, out: cute.Tensor,
        threads: cutlass.Constexpr = 256):
    """out[i] = x[i] * y[i] for 1-D tensors of one dtype (f32/f16/bf16) and length n.

    Expects unit stride and 16-byte-aligned base pointers (as JAX buffers are).
    """
    dt = _check_1d("mul", x, y, out)
    vec = _vec_width(dt)
    n = cute.size(x, mode=[0])
    per_block = threads * vec
    grid = (n + per_block - 1) // per_block
    _mul_kernel(x, y, out, threads, vec).launch(
        grid=[grid, 1, 1], block=[threads, 1, 1], stream=stream)


@cute.jit
def mul_bwd(x: cute.Tensor, y: cute.Tensor, dout: cute.Tensor, grads, stream,
            threads: cutlass.Constexpr = 256):
    """Backward of out = x * y: ``grads = (dx, dy)``; dx = dout * y, dy = dout * x.

    All five tensors are 1-D of one length and dtype (f32/f16/bf16).
    """
    dx, dy = grads
    dt = _check_1d("mul_bwd", x, y, dout, dx, dy)
    vec = _vec_width(dt)
    n = cute.size(x, mode=[0])
    per_block = threads * vec
    grid = (n + per_block - 1) // per_block
    _mul_bwd_kernel(x, y, dout, dx, dy, threads, vec).launch(
        grid=[grid, 1, 1], block=[threads, 1, 1], stream=stream)
