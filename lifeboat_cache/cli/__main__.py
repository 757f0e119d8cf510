"""`python -m lifeboat_cache.cli ...`: the `lifeboat` command."""

import sys

try:
    from .parser import main
except KeyboardInterrupt:  # Ctrl-C while the package imports: the same clean exit as in main()
    print("lifeboat: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
