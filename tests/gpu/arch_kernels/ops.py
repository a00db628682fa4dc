"""A small elementwise kernel for tests/gpu/test_fallback_gpu.py's arch cases: built only
for a GPU the lent machines are not (sm_100a), so on them its fallback serves."""

import cutlass
import cutlass.cute as cute


@cute.kernel
def _scale(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] * factor


@cute.jit
def scale(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream):
    """out = x * factor over a 1-D float32 array."""
    n = x.shape[0]
    _scale(x, out, factor, n).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)
