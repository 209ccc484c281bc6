"""``python -m paraplan``: the same command line as the ``paraplan`` script."""

from paraplan.cli.app import main

main()
