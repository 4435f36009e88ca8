"""``python -m asyncq.cli``: the same as the ``asyncq`` console script."""

from asyncq.cli import main

main()
