"""Cache lifecycle commands as library functions: one small module per `cutecc` command.

Each takes plain arguments, works on a `Store`, returns data (or raises `CuteccError`),
and is usable and tested without the command line; `cutecc.cli` only parses and renders.
"""
