"""Row-wise RMSNorm in CuTe DSL: out = x * rsqrt(mean(x^2) + eps) * w.

One thread block per row. Each thread owns ``iters`` chunks of ``vec``
contiguous elements (chunk c = tid + i * block_size), read with 128-bit
accesses where d allows. Sum of squares is accumulated in Float32, reduced
with warp butterflies then across warps through shared memory. The row stays
in registers between the reduction and the write when it is small enough,
otherwise it is re-read (from L1/L2) for the write pass.
"""

import cutlass
import cutlass.cute as cute

_MAX_CACHED_ELEMS = 64  # per-thread register budget for caching the row


def _plan(x, w, out, block_size):
    """Compile-time checks and tiling choice: returns (d, vec, iters, cache)."""
    dt = x.element_type
    if w.element_type != dt or out.element_type != dt:
        raise TypeError("RMSNorm: x, w and out must share one dtype")
    if cute.rank(x.layout) != 2 or cute.rank(out.layout) != 2 or cute.rank(w.layout) != 1:
        raise TypeError("RMSNorm: expected x, out of rank 2 and w of rank 1")
    d = x.shape[1]
    if not isinstance(d, int):
        raise TypeError("RMSNorm: the row length d (x.shape[1]) must be static at compile time")
    if out.shape[1] != d or w.shape[0] != d:
        raise TypeError("RMSNorm: x, out and w must agree on d")
    # Widest vector (<= 128 bits) dividing d keeps every chunk aligned and in-row.
    vec = 128 // dt.width
    while d % vec != 0:
        vec //= 2
    chunks = d // vec
    iters = (chunks + block_size - 1) // block_size
    cache = iters * vec <= _MAX_CACHED_ELEMS
    return d, vec, iters, cache


class RMSNorm:
    """RMSNorm launcher. ``block_size`` threads (a multiple of 32, <= 1024) per row."""

    def __init__(self, block_size: int):
        if block_size % 32 != 0 or not 32 <= block_size <= 1024:
            raise ValueError(f"block_size must be a multiple of 32 in [32, 1024], got {block_size}")
        self.block_size = block_size
        self.num_warps = block_size // 32

    @cute.kernel
    def _kernel(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor,
                eps: cutlass.Float32, d: cutlass.Constexpr, vec: cutlass.Constexpr,
                iters: cutlass.Constexpr, cache: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        chunks = d // vec
        full = chunks % self.block_size == 0  # python bool: no predication needed

        smem = cutlass.utils.SmemAllocator()
        partial = smem.allocate_tensor(cutlass.Float32, cute.make_layout(self.num_warps), 16)

        gx = cute.zipped_divide(x[row, None], (vec,))    # ((vec), (chunks))
        go = cute.zipped_divide(out[row, None], (vec,))
        gw = cute.zipped_divide(w, (vec,))

        # Pass 1: sum of squares (Float32).
        rx = cute.make_rmem_tensor(((vec,), iters), x.element_type)  # same mode shape as a gx chunk
        acc = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(iters):
            c = tidx + i * self.block_size
            if cutlass.const_expr(full):
                v = gx[(None, c)].load()
                if cutlass.const_expr(cache):
                    rx[None, i].store(v)
                vf = v.to(cutlass.Float32)
                acc = acc + (vf * vf).reduce(cute.ReductionOp.ADD, 0.0, 0)
            else:
                if c < chunks:
                    v = gx[(None, c)].load()
                    if cutlass.const_expr(cache):
                        rx[None, i].store(v)
                    vf = v.to(cutlass.Float32)
                    acc = acc + (vf * vf).reduce(cute.ReductionOp.ADD, 0.0, 0)

        # Block reduction: warp butterfly, per-warp partials in smem, then every
        # warp re-reduces the partials so all threads hold the total.
        acc = cute.arch.warp_reduction_sum(acc)
        if lane == 0:
            partial[warp] = acc
        cute.arch.sync_threads()
        tot = cutlass.Float32(0.0)
        if lane < self.num_warps:
            tot = partial[lane]
        tot = cute.arch.warp_reduction_sum(tot)
        rstd = cute.math.rsqrt(tot * cutlass.Float32(1.0 / d) + eps, fastmath=False)

        # Pass 2: normalise, scale by w, store in the input dtype.
        for i in cutlass.range_constexpr(iters):
            c = tidx + i * self.block_size
            if cutlass.const_expr(full):
                self._write(gx, gw, go, rx, rstd, c, i, cache)
            else:
                if c < chunks:
                    self._write(gx, gw, go, rx, rstd, c, i, cache)

    @cute.jit
    def _write(self, gx, gw, go, rx, rstd, c, i: cutlass.Constexpr, cache: cutlass.Constexpr):
        if cutlass.const_expr(cache):
            vf = rx[None, i].load().to(cutlass.Float32)
        else:
            vf = gx[(None, c)].load().to(cutlass.Float32)
        wf = gw[(None, c)].load().to(cutlass.Float32)
        y = vf * rstd * wf
        go[(None, c)].store(y.to(go.element_type))

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor,
                 eps: cutlass.Float32, stream):
        """x, out: [m, d] row-major (m runtime, d static); w: [d]. One dtype (f32/f16/bf16)."""
        d, vec, iters, cache = _plan(x, w, out, self.block_size)
        m = cute.size(x, mode=[0])
        self._kernel(x, w, out, eps, d, vec, iters, cache).launch(
            grid=[m, 1, 1], block=[self.block_size, 1, 1], stream=stream)


def make_rmsnorm(*, block_size: int) -> RMSNorm:
    """Build an RMSNorm launcher with ``block_size`` threads per row."""
    return RMSNorm(block_size)
