"""Project a's `scale` (tests/gpu/test_projects_gpu.py): out = x * factor."""

import cutlass
import cutlass.cute as cute


@cute.kernel
def _scale_kernel(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] * factor


@cute.jit
def scale(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream,
          threads: cutlass.Constexpr = 128):
    n = x.shape[0]
    _scale_kernel(x, out, factor, n).launch(
        grid=[(n + threads - 1) // threads, 1, 1], block=[threads, 1, 1], stream=stream)
