"""What the build reads of its tools and of the build host: versions, installed distributions,
module lookup, device queries, ELF and cubin readers, target libraries.
"""
