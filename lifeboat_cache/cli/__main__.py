"""`python -m lifeboat_cache.cli ...`: the `lifeboat` command."""

import sys

from . import main

sys.exit(main())
