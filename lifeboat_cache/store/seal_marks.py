"""The seal marks of a store's tiers, checked and written when the store opens (records/seal_mark.py).

Why: a sealed store must stay sealed when a process is started without its key (a secret that did
not mount, a config that lost `encryption:`). A store that seals writes its key's mark into every
tier that keeps marks; a store without a key that finds a mark refuses to open for writing, and one
opened only to look (the CLI, read-only) serves no plaintext record of it.

Checked once, at open: a keyless process that was already running when another one first sealed
the directory or bucket is not stopped (restart it with the key). A tier that cannot be listed for
marks (an S3 server that does not answer yet) is logged and skipped: the mark is a guard against a
misconfigured writer, not what keeps pages safe (a keyless writer still cannot plant a page that a
keyed reader serves).
"""

from __future__ import annotations

import logging
from typing import Sequence

from ..config import ConfigError
from ..records import MARK_PREFIX, MAX_MARK_BYTES, Sealer, is_mark_name, mark_bytes, mark_name, mark_verifies
from ..tiers import Marking, Tier

log = logging.getLogger(__name__)


def check_seal_marks(tiers: Sequence[Tier], sealer: Sealer, *, writes: bool) -> None:
    """Read every Marking tier's seal marks; write this store's (a sealing key, `require_sealed` on,
    `writes`), or refuse a keyless writer (ConfigError, one line naming the fix), or turn
    require_sealed on for a keyless reader. `writes`: the store may write pages (not read-only,
    not the CLI's inspection)."""
    for tier in tiers:
        if not isinstance(tier, Marking):
            continue
        try:
            marks = {n: b for n, b in tier.read_marks(MARK_PREFIX, MAX_MARK_BYTES).items() if is_mark_name(n)}
        except OSError as e:
            log.warning("lifeboat: %s: cannot list its seal marks (%s); not checked", tier.name, e)
            continue
        if not sealer.active:
            if marks and writes:
                raise ConfigError(
                    f"{tier.name} is a sealed store ({', '.join(sorted(marks))}) and this process has no encryption "
                    "key, so it would write plaintext pages into it: set LIFEBOAT_KEY_FILE (or encryption.keys) to "
                    "the store's key file, or point storage at another path")
            if marks:
                sealer.refuse_plaintext()
            continue
        key = sealer.keyring.sealing if sealer.keyring is not None else None
        if not writes or key is None or not sealer.require_sealed:
            if marks and not sealer.require_sealed:
                log.warning("lifeboat: %s is a sealed store, and encryption.require_sealed is off: plaintext records "
                            "in it (only a writer without the key puts them there) are served", tier.name)
            continue  # inspection, and a migration from a plaintext store, write no mark
        name = mark_name(key.id)
        have = marks.get(name)
        if have is not None and mark_verifies(key, have):
            continue
        if have is not None:
            log.warning("lifeboat: %s: seal mark %s does not verify under this key; writing it again", tier.name, name)
        try:
            tier.write_mark(name, mark_bytes(key))
        except OSError as e:
            log.warning("lifeboat: %s: cannot write its seal mark %s (%s)", tier.name, name, e)
