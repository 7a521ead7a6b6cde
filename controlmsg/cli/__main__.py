"""``python -m controlmsg.cli``: the ``controlmsg`` command, as ``python -m controlmsg``."""

from controlmsg.cli import run

if __name__ == "__main__":
    run()
