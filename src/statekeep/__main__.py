"""``python -m statekeep`` runs the command line."""

from statekeep.cli import main

main()
