"""`python -m minitransformer ...` is the same as the `minitransformer` command."""

import sys

from .cli import main

sys.exit(main())
