"""`python -m lifeboat_cache.cli ...`: the `lifeboat` command."""

import sys

from .parser import main

sys.exit(main())
