"""``python -m controlmsg`` is the ``controlmsg`` command."""

import sys

from controlmsg.cli import main

sys.exit(main())
