"""`python -m cutecc.cli`: the command line."""

from cutecc.cli import main

main()
