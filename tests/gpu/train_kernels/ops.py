"""Toy launchers whose contracts need derived extents, derived scalars and scratch.

One thread per element, f32, simple on purpose: what they test is the contract (sizes the
runtime computes, scalars it passes, buffers it allocates and drops), not speed.
"""

import cutlass
import cutlass.cute as cute

THREADS = 128


@cute.kernel
def _pad_kernel(x: cute.Tensor, out: cute.Tensor, cols: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    row, bidy, _ = cute.arch.block_idx()
    j = bidy * THREADS + tidx
    n = cute.size(x, mode=[1])
    if j < cols:
        if j < n:
            out[row, j] = x[row, j]
        else:
            out[row, j] = cutlass.Float32(0.0)


@cute.jit
def pad_cols(x: cute.Tensor, out: cute.Tensor, cols: cutlass.Int32, stream):
    """out = x with its columns zero-padded to `cols` (the runtime passes cols, which is
    out's derived width, round_up(n, 32))."""
    m = cute.size(x, mode=[0])
    _pad_kernel(x, out, cols).launch(grid=[m, (cols + THREADS - 1) // THREADS, 1],
                                     block=[THREADS, 1, 1], stream=stream)


@cute.kernel
def _partials_kernel(x: cute.Tensor, partials: cute.Tensor, rows_per: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, b, _ = cute.arch.block_idx()
    j = bidx * THREADS + tidx
    m = cute.size(x, mode=[0])
    d = cute.size(x, mode=[1])
    if j < d:
        acc = cutlass.Float32(0.0)
        lo = b * rows_per
        for i in range(lo, lo + rows_per):
            if i < m:
                acc = acc + x[i, j]
        partials[b, j] = acc


@cute.jit
def col_partials(stream, x: cute.Tensor, partials: cute.Tensor, blocks: cutlass.Int32,
                 rows_per: cutlass.Int32):
    """partials[b, :] = the sum of x's rows b*rows_per .. (b+1)*rows_per - 1 (quack's RMSNorm
    backward writes such per-SM partial sums, which the caller adds up); blocks is the SM
    count and rows_per = ceil_div(m, blocks), both passed by the runtime."""
    d = cute.size(x, mode=[1])
    _partials_kernel(x, partials, rows_per).launch(
        grid=[(d + THREADS - 1) // THREADS, blocks, 1], block=[THREADS, 1, 1], stream=stream)


@cute.kernel
def _stage1(x: cute.Tensor, tmp: cute.Tensor, acc: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < cute.size(x, mode=[0]):
        tmp[i] = x[i] * cutlass.Float32(2.0)
        acc[i] = acc[i] + x[i]  # right only if acc arrives zeroed


@cute.kernel
def _stage2(tmp: cute.Tensor, acc: cute.Tensor, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < cute.size(out, mode=[0]):
        out[i] = tmp[i] + acc[i]


@cute.jit
def triple(x: cute.Tensor, out: cute.Tensor, tmp: cute.Tensor, acc: cute.Tensor, stream):
    """out = 3 x in two launches through scratch: tmp (uninitialised) = 2 x, acc (zeroed,
    rounded up to 64 elements) += x, then out = tmp + acc."""
    n = cute.size(x, mode=[0])
    grid = [(n + THREADS - 1) // THREADS, 1, 1]
    _stage1(x, tmp, acc).launch(grid=grid, block=[THREADS, 1, 1], stream=stream)
    _stage2(tmp, acc, out).launch(grid=grid, block=[THREADS, 1, 1], stream=stream)


@cute.kernel
def _expw_kernel(x: cute.Tensor, w: cute.Tensor, out: cute.Tensor, e: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, bidy, _ = cute.arch.block_idx()
    j = bidy * THREADS + tidx
    if j < cute.size(x, mode=[1]):
        v = cute.math.exp(x[row, j])
        e[row, j] = v
        out[row, j] = v * w[j]


@cute.jit
def expw(x: cute.Tensor, w: cute.Tensor, out: cute.Tensor, e: cute.Tensor, stream):
    """out = exp(x) * w (w broadcast over rows); e = exp(x) is saved for the backward."""
    m = cute.size(x, mode=[0])
    d = cute.size(x, mode=[1])
    _expw_kernel(x, w, out, e).launch(grid=[m, (d + THREADS - 1) // THREADS, 1],
                                      block=[THREADS, 1, 1], stream=stream)


@cute.kernel
def _expw_bwd_kernel(w: cute.Tensor, e: cute.Tensor, dout: cute.Tensor, dx: cute.Tensor,
                     dw: cute.Tensor, rows_per: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, b, _ = cute.arch.block_idx()
    j = bidx * THREADS + tidx
    m = cute.size(e, mode=[0])
    if j < cute.size(e, mode=[1]):
        acc = cutlass.Float32(0.0)
        lo = b * rows_per
        for i in range(lo, lo + rows_per):
            if i < m:
                g = dout[i, j] * e[i, j]
                dx[i, j] = g * w[j]
                acc = acc + g
        dw[b, j] = acc


@cute.jit
def expw_bwd(w: cute.Tensor, e: cute.Tensor, dout: cute.Tensor, dx: cute.Tensor, dw: cute.Tensor,
             rows_per: cutlass.Int32, stream):
    """Backward of expw from the saved e: dx = dout * e * w, and dw as per-SM partial sums
    over rows (dw[b, :], b < SM count) that the runtime sums (reduce = "sum")."""
    d = cute.size(e, mode=[1])
    blocks = cute.size(dw, mode=[0])
    _expw_bwd_kernel(w, e, dout, dx, dw, rows_per).launch(
        grid=[(d + THREADS - 1) // THREADS, blocks, 1], block=[THREADS, 1, 1], stream=stream)


@cute.kernel
def _bias_kernel(x: cute.Tensor, b: cute.Tensor, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, bidy, _ = cute.arch.block_idx()
    j = bidy * THREADS + tidx
    if j < cute.size(x, mode=[1]):
        out[row, j] = x[row, j] + b[row, j]


@cute.jit
def add_bias(x: cute.Tensor, b: cute.Tensor, out: cute.Tensor, stream):
    """out = x + b, with b seen as (m, d) but read through row stride 0 (one row in memory)."""
    m = cute.size(x, mode=[0])
    d = cute.size(x, mode=[1])
    _bias_kernel(x, b, out).launch(grid=[m, (d + THREADS - 1) // THREADS, 1],
                                   block=[THREADS, 1, 1], stream=stream)


@cute.kernel
def _wide_kernel(x: cute.Tensor, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = cutlass.Int64(bidx) * THREADS + cutlass.Int64(tidx)
    if i < cute.size(x, mode=[0]):
        out[i] = x[i] + cutlass.Uint8(1)


@cute.jit
def plus_one_wide(x: cute.Tensor, out: cute.Tensor, stream):
    """out = x + 1 over a 1-D uint8 array whose length may be 2^31 or more (64-bit extent)."""
    n = cute.size(x, mode=[0])
    _wide_kernel(x, out).launch(grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                stream=stream)


@cute.kernel
def _mul2d_kernel(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, bidy, _ = cute.arch.block_idx()
    j = bidy * THREADS + tidx
    if j < cute.size(a, mode=[1]):
        out[row, j] = a[row, j] * b[row, j]


@cute.jit
def mul2d(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, stream):
    """out = a * b (2-D): the first launch of a composite backward."""
    m = cute.size(a, mode=[0])
    d = cute.size(a, mode=[1])
    _mul2d_kernel(a, b, out).launch(grid=[m, (d + THREADS - 1) // THREADS, 1],
                                    block=[THREADS, 1, 1], stream=stream)


@cute.kernel
def _scale_partials_kernel(w: cute.Tensor, g: cute.Tensor, dx: cute.Tensor, dw: cute.Tensor,
                           rows_per: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, b, _ = cute.arch.block_idx()
    j = bidx * THREADS + tidx
    m = cute.size(g, mode=[0])
    if j < cute.size(g, mode=[1]):
        acc = cutlass.Float32(0.0)
        lo = b * rows_per
        for i in range(lo, lo + rows_per):
            if i < m:
                dx[i, j] = g[i, j] * w[j]
                acc = acc + g[i, j]
        dw[b, j] = acc


@cute.jit
def scale_partials(w: cute.Tensor, g: cute.Tensor, dx: cute.Tensor, dw: cute.Tensor,
                   rows_per: cutlass.Int32, stream):
    """dx = g * w and per-SM partial column sums of g: the second launch."""
    d = cute.size(g, mode=[1])
    blocks = cute.size(dw, mode=[0])
    _scale_partials_kernel(w, g, dx, dw, rows_per).launch(
        grid=[(d + THREADS - 1) // THREADS, blocks, 1], block=[THREADS, 1, 1], stream=stream)
