"""`python -m lifeboat_cache.cli ...`: the `lifeboat` command."""

import sys

from .commands import main

sys.exit(main())
