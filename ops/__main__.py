"""`python -m ops ...` is the same as the `flotilla` console script."""

import sys

from ops.cli import main

sys.exit(main())
