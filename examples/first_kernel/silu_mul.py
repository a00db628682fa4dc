"""out = silu(a) * b for 2-D float32 or bfloat16 arrays, forward and backward, in CuTe DSL.

Each thread owns one chunk of `vec` contiguous elements, one 128-bit access (4 float32 or
8 bfloat16), and the grid is 1-D over the chunks of the flattened array, so any row count
fits; the one partial chunk at the end takes a scalar path. Arithmetic is in float32.
"""

import cutlass
import cutlass.cute as cute


def _sigmoid(x):
    return 1.0 / (1.0 + cute.math.exp(-x, fastmath=True))


@cute.kernel
def _silu_mul_kernel(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor,
                     threads: cutlass.Constexpr, vec: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = cute.size(a, mode=[0])
    t = bidx * threads + tidx              # this thread's chunk
    base = t * vec                         # its first element
    if base + vec <= n:                    # a whole chunk: 128-bit loads and store
        ga = cute.zipped_divide(a, (vec,))
        gb = cute.zipped_divide(b, (vec,))
        go = cute.zipped_divide(out, (vec,))
        x = ga[(None, t)].load().to(cutlass.Float32)
        y = gb[(None, t)].load().to(cutlass.Float32)
        go[(None, t)].store((x * _sigmoid(x) * y).to(out.element_type))
    elif base < n:                         # the tail: one element at a time
        for k in cutlass.range_constexpr(vec):
            if base + k < n:
                x = a[base + k].to(cutlass.Float32)
                y = b[base + k].to(cutlass.Float32)
                out[base + k] = (x * _sigmoid(x) * y).to(out.element_type)


@cute.kernel
def _silu_mul_bwd_kernel(a: cute.Tensor, b: cute.Tensor, dout: cute.Tensor,
                         da: cute.Tensor, db: cute.Tensor,
                         threads: cutlass.Constexpr, vec: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = cute.size(a, mode=[0])
    t = bidx * threads + tidx
    base = t * vec
    if base + vec <= n:
        ga = cute.zipped_divide(a, (vec,))
        gb = cute.zipped_divide(b, (vec,))
        gd = cute.zipped_divide(dout, (vec,))
        gda = cute.zipped_divide(da, (vec,))
        gdb = cute.zipped_divide(db, (vec,))
        x = ga[(None, t)].load().to(cutlass.Float32)
        y = gb[(None, t)].load().to(cutlass.Float32)
        g = gd[(None, t)].load().to(cutlass.Float32)
        s = _sigmoid(x)
        # d silu(x)/dx = s * (1 + x * (1 - s))
        gda[(None, t)].store((g * y * s * (1.0 + x * (1.0 - s))).to(da.element_type))
        gdb[(None, t)].store((g * x * s).to(db.element_type))
    elif base < n:
        for k in cutlass.range_constexpr(vec):
            if base + k < n:
                x = a[base + k].to(cutlass.Float32)
                y = b[base + k].to(cutlass.Float32)
                g = dout[base + k].to(cutlass.Float32)
                s = _sigmoid(x)
                da[base + k] = (g * y * s * (1.0 + x * (1.0 - s))).to(da.element_type)
                db[base + k] = (g * x * s).to(db.element_type)


def _flat(t: cute.Tensor) -> cute.Tensor:
    """The dense row-major (m, n) tensor as one run of m * n elements."""
    return cute.make_tensor(t.iterator, cute.make_layout(cute.size(t)))


def _grid(n, threads: int, vec: int):
    per_block = threads * vec
    return [(n + per_block - 1) // per_block, 1, 1]


@cute.jit
def silu_mul(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, stream,
             threads: cutlass.Constexpr = 256):
    """out = silu(a) * b; a, b and out are (m, n), dense, of one dtype."""
    vec = 128 // a.element_type.width      # elements per 128-bit access
    n = cute.size(a)
    _silu_mul_kernel(_flat(a), _flat(b), _flat(out), threads, vec).launch(
        grid=_grid(n, threads, vec), block=[threads, 1, 1], stream=stream)


@cute.jit
def silu_mul_bwd(a: cute.Tensor, b: cute.Tensor, dout: cute.Tensor, grads, stream,
                 threads: cutlass.Constexpr = 256):
    """grads = (da, db) of out = silu(a) * b, given dout."""
    da, db = grads
    vec = 128 // a.element_type.width
    n = cute.size(a)
    _silu_mul_bwd_kernel(_flat(a), _flat(b), _flat(dout), _flat(da), _flat(db), threads, vec).launch(
        grid=_grid(n, threads, vec), block=[threads, 1, 1], stream=stream)
