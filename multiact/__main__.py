"""`python -m multiact ...` is the `multiact` command."""

import sys

from .cli import main

sys.exit(main())
