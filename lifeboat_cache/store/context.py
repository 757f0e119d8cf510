"""StoreContext: what one store's read path and write path share, built once by the ChunkStore."""

from __future__ import annotations

from dataclasses import dataclass

from ..cooldown import Cooldown
from ..metrics import Counters
from ..records import Sealer
from ..tiers import Tier
from .calls import IoCalls
from .copier import Copier
from .refused import Refused


@dataclass(frozen=True)
class StoreContext:
    """The store's tiers and the state every call over them uses.

    `tiers` is the store's own list, not a copy: a tier swapped in there is used by both paths.
    Reads and writes cool down separately (a full disk stops writes, not reads). `compress`: whether
    the first tier stores pages compressed. `copier`: the background copy to the lower tiers (None
    with a single tier). `refused`: per tier, pages indexed there that this process will not serve
    (refused.py): the read path adds them, lookups and `put` leave them out."""

    tiers: list[Tier]
    read_cooldowns: list[Cooldown]
    write_cooldowns: list[Cooldown]
    counters: Counters
    sealer: Sealer
    calls: IoCalls
    compress: bool
    copier: Copier | None
    refused: Refused
