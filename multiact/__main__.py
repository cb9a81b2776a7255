"""`python -m multiact ...` is the `multiact` command."""

import sys

from .tools.cli import main

sys.exit(main())
