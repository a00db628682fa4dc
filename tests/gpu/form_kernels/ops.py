"""Launchers for tests/gpu/test_forms_gpu.py (issue 48, item 9): an optional operand chosen
per variant, a vector width chosen from the call's extents, and a persistent grid sized by the
DSL's own HardwareInfo while traced (answered from the build's hardware profile); and (issue
48, item 8) the two launches of a composite whose last one writes an array of an input's
extents that none of its own arrays carries."""

import cutlass
import cutlass.cute as cute
from cutlass.utils import HardwareInfo


@cute.kernel
def _scaled(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < n:
        out[i] = x[i] * factor


@cute.kernel
def _biased(x: cute.Tensor, bias: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32,
            n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < n:
        out[i] = x[i] * factor + bias[i]


@cute.jit
def axpb(x: cute.Tensor, bias, out: cute.Tensor, factor: cutlass.Float32, stream):
    """out = x * factor (+ bias when one is passed: None in its slot is the other form)."""
    n = x.shape[0]
    grid = [(n + 127) // 128, 1, 1]
    if cutlass.const_expr(bias is None):
        _scaled(x, out, factor, n).launch(grid=grid, block=[128, 1, 1], stream=stream)
    else:
        _biased(x, bias, out, factor, n).launch(grid=grid, block=[128, 1, 1], stream=stream)


@cute.kernel
def _vscale(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32,
            vec: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    base = (bidx * 128 + tidx) * vec
    for j in cutlass.range_constexpr(vec):
        if base + j < n:
            out[base + j] = x[base + j] * factor


@cute.jit
def vscale(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream,
           vec: cutlass.Constexpr = 1):
    """out = x * factor, each thread `vec` consecutive elements (n a multiple of vec)."""
    n = x.shape[0]
    per_block = 128 * vec
    _vscale(x, out, factor, n, vec).launch(grid=[(n + per_block - 1) // per_block, 1, 1],
                                           block=[128, 1, 1], stream=stream)


@cute.kernel
def _persistent(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32,
                blocks: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    for i in cutlass.range(bidx * 128 + tidx, n, blocks * 128):
        out[i] = x[i] * factor


@cute.jit
def persistent(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream):
    """A grid-stride loop over as many blocks as can be resident at once, asked of the DSL's
    HardwareInfo while traced (as FA4's and quack's persistent schedulers ask)."""
    blocks = HardwareInfo().get_max_active_clusters(1)
    _persistent(x, out, factor, x.shape[0], blocks).launch(grid=[blocks, 1, 1], block=[128, 1, 1],
                                                           stream=stream)


@cute.kernel
def _pad_rows(x: cute.Tensor, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, bidy, _ = cute.arch.block_idx()
    j = bidy * 128 + tidx
    if j < cute.size(out, mode=[1]):
        if row < cute.size(x, mode=[0]):
            out[row, j] = x[row, j] * 2.0
        else:
            out[row, j] = cutlass.Float32(0.0)


@cute.jit
def pad_rows(x: cute.Tensor, out: cute.Tensor, stream):
    """out = 2 x with its rows zero-padded to out's (a multiple of 64, as FA4's accumulators
    round the query length up to the tile)."""
    _pad_rows(x, out).launch(grid=[cute.size(out, mode=[0]), (cute.size(out, mode=[1]) + 127) // 128, 1],
                             block=[128, 1, 1], stream=stream)


@cute.kernel
def _crop(p: cute.Tensor, out: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, bidy, _ = cute.arch.block_idx()
    j = bidy * 128 + tidx
    if j < cute.size(out, mode=[1]):
        out[row, j] = p[row, j] + 1.0


@cute.jit
def crop_rows(p: cute.Tensor, out: cute.Tensor, stream):
    """out = p's leading rows + 1, as many as out has: no argument but out carries that
    count (FA4's postprocess sizes dq so)."""
    _crop(p, out).launch(grid=[cute.size(out, mode=[0]), (cute.size(out, mode=[1]) + 127) // 128, 1],
                         block=[128, 1, 1], stream=stream)
