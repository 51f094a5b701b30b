"""`python -m tracediag` runs the command line."""

from tracediag.cli import main

main()
