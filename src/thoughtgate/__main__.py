"""``python -m thoughtgate`` is the CLI."""

from thoughtgate.cli import main

main()
