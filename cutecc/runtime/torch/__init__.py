"""The PyTorch front end of the runtime (`cutecc.torch` is its public face).

The same libraries the JAX runtime runs, found, checked and verified by the same loader
(`cutecc.runtime.loader.load_with`) and chosen per call by the same contract logic
(`cutecc.runtime.calls`); this package adds only how torch calls them. Imports torch and
apache-tvm-ffi, never JAX nor the DSL.

Each build's kernel is a `tvm_ffi.Function` taking the kernel's dense buffers (inputs,
then results, then runtime scalars); tvm-ffi accepts torch tensors through DLPack and
sets torch's current CUDA stream as the call's environment stream, which is the stream
the kernels launch on. Two ways reach it:

- eager (not compiling, no autograd needed, plain tensors): the function is called
  directly, with outputs allocated from the contract; a call costs the contract check
  (cached per signature) and the launch (`eager`);
- otherwise through a `torch.library` custom op per kernel and contract
  (`torch.ops.cutecc.<kernel>_<contract digest>`), with a fake implementation computing
  output shapes from the contract, `inout` tensors declared mutated and autograd from the
  manifest's `grad` pairing: `torch.compile(fullgraph=True)` traces it without a graph
  break and `torch.autograd` differentiates it (`op`).

- `conversions`: dtypes, dimensions, scalars, errors, tensors to and from dense buffers;
- `op`: the custom ops; `eager`: the direct call, planned per call signature;
- `kernel`: `TorchKernelFn`, `TorchCompositeFn`, `TorchKernelSet`, the device, `load`.

Importing this package imports nothing yet (not even torch); its modules import torch.
"""
