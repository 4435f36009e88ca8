"""``python -m chaos [--quick] [--only NAME ...] [--json PATH]``."""

from chaos.runner import main

main()
