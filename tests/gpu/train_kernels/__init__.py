"""Toy kernels for derived extents, derived scalars and scratch (issue 23)."""
