"""kernels.lock: its lines and its signature.
"""
