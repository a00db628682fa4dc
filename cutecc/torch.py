"""`cutecc.torch`: the kernels of a cutecc cache or pack, called from PyTorch.

    import torch, cutecc.torch
    kernels = cutecc.torch.load()        # the same arguments as cutecc.load
    y = kernels.rmsnorm(x, w, eps=1e-5)  # eagerly, under torch.compile, with autograd

The names users import; the front end itself is `cutecc.runtime.torch` (custom ops, the
eager path, the kernel objects, conversions). Imports torch and apache-tvm-ffi, never JAX
nor the DSL.
"""

from __future__ import annotations

from cutecc.runtime.torch.conversions import KernelCallError, KernelTypeError
from cutecc.runtime.torch.kernel import (
    TorchCompositeFn,
    TorchKernelFn,
    TorchKernelSet,
    device_arch,
    device_kind,
    load,
)
from cutecc.runtime.torch.op import NAMESPACE, op_name, op_schema

__all__ = ["KernelCallError", "KernelTypeError", "TorchCompositeFn", "TorchKernelFn", "TorchKernelSet",
           "load"]

# Also here, for tools naming the custom ops: NAMESPACE, op_name, op_schema; and the device
# a load serves by default: device_arch, device_kind.
_NAMES = (NAMESPACE, op_name, op_schema, device_arch, device_kind)
