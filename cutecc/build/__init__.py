"""Building: compile a variant, link it, retarget it, run many in workers and executors.
"""
