"""CuTe DSL kernels that fail on the GPU on purpose (see faults.py and kernels.toml)."""
