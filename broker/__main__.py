"""`python -m broker`: the same as the `docbroker` command."""

import sys

from broker.cli import main

sys.exit(main())
