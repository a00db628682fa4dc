"""A toy kernel whose variants differ only in a call keyword (FA4's `causal` in small), and
its backward: the source of a package `fa` that tests write under tmp_path."""

OPS = '''
import cutlass
import cutlass.cute as cute


@cute.kernel
def _k(x: cute.Tensor, out: cute.Tensor, f: cutlass.Constexpr):
    i, _, _ = cute.arch.thread_idx()
    if i < cute.size(x):
        out[i] = x[i] * f


@cute.jit
def attn(x: cute.Tensor, out: cute.Tensor, stream, causal: cutlass.Constexpr = False):
    _k(x, out, 2 if causal else 1).launch(grid=[1, 1, 1], block=[128, 1, 1], stream=stream)


@cute.jit
def attn_bwd(x: cute.Tensor, ct: cute.Tensor, dx: cute.Tensor, stream,
             causal: cutlass.Constexpr = False):
    _k(ct, dx, 2 if causal else 1).launch(grid=[1, 1, 1], block=[128, 1, 1], stream=stream)
'''
