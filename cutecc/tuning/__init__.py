"""Build-time autotuning: the candidate plan, the measurement on a GPU (the tuning space's
grammar is the manifest's: `cutecc.manifest.tune_space`)."""
