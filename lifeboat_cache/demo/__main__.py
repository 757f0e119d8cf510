"""``python -m lifeboat_cache.demo``: the returning-user demo (see ``returning_user``)."""

from .returning_user import main

raise SystemExit(main())
