"""`python -m broker.cli`: the same as `docbroker` and `python -m broker`."""

import sys

from broker.cli import main

sys.exit(main())
