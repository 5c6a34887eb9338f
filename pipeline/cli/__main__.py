"""``python -m demoforge.pipeline.cli``: the same as the ``demoforge`` command."""

import sys

from demoforge.pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
