"""Example CuTe DSL kernels (sm_90a)."""
