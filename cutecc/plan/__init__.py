"""What to build: cache keys, keyed sources, the build plan and the tuning plan.
"""
