"""The calling convention: tensor, scalar and struct arguments, their extents' expressions,
dtypes, tuning buckets, composite lines, cotangents and fallbacks. Shared by every side
(base layer).
"""
