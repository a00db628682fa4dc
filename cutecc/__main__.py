"""`python -m cutecc`: the command line, where no `cutecc` script is on PATH (wheels
installed with `pip install --target`, a zipapp, an interpreter named explicitly)."""

from cutecc.cli import main

if __name__ == "__main__":
    main(prog_name="cutecc")
