"""``python -m controlmsg`` is the ``controlmsg`` command."""

from controlmsg.cli import run

run()
