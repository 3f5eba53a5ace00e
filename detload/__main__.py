"""``python -m detload``: the same command line as the ``detload`` script (for environments
where the script is not on PATH)."""

import sys

from .cli import main

sys.exit(main())
