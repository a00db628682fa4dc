"""Build-time autotuning: the tuning space, the candidate plan, the measurement on a GPU."""
