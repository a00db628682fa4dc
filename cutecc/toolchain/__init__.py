"""What the build reads of its tools and of the build host: versions, installed distributions,
module lookup, the planning caches and the user's planning memory, device queries, ELF and
cubin readers, target libraries.
"""
