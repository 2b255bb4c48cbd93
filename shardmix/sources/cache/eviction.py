"""Which copies a bounded cache evicts to make room: the plans' choice.

Each running epoch tells the ledger its lanes' shards in order (``plans`` and ``wants``,
:meth:`~shardmix.sources.cache.ledger.CacheLedger.plan`), so the cache knows how soon each copy is
needed again. :func:`choose_victims` picks, among the ready copies nobody reads: first those no live
plan reads again this epoch, least recently used first; then those needed furthest ahead; and
stops at a copy needed sooner than the newcomer it would make room for. Left to others: the
transaction, the deletions and trims it leads to (:mod:`shardmix.sources.cache.ledger`).
"""

from __future__ import annotations

import sqlite3

__all__ = ["choose_victims", "next_need"]


def choose_victims(
    db: sqlite3.Connection, url: str, needed: int
) -> tuple[list[tuple[str, int]], int]:
    """The copies to evict to free ``needed`` bytes for ``url``, in order, and the bytes
    they free: fewer than ``needed`` when the copies that may go for it are too few."""
    if needed <= 0:
        return [], 0
    rows = db.execute(
        "SELECT e.path, e.size, e.used, "
        "(SELECT MIN(w.position - p.at) FROM wants w JOIN plans p ON p.plan = w.plan "
        " WHERE w.url = e.url) "
        "FROM entries e WHERE e.state = 'ready' "
        "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.path = e.path)"
    ).fetchall()
    own = next_need(db, url)
    # Unneeded first (least recently used first), then the furthest ahead first.
    rows.sort(key=lambda row: (0, row[2]) if row[3] is None else (1, -row[3]))
    chosen: list[tuple[str, int]] = []
    freed = 0
    for path, size, _, need in rows:
        if freed >= needed:
            break
        if need is not None and (own is None or need <= own):
            break  # needed sooner than the newcomer: keep it
        chosen.append((path, size))
        freed += size
    return chosen, freed


def next_need(db: sqlite3.Connection, url: str) -> int | None:
    """How many shards ahead the soonest live plan reads ``url`` (None: no plan does)."""
    (need,) = db.execute(
        "SELECT MIN(w.position - p.at) FROM wants w JOIN plans p ON p.plan = w.plan "
        "WHERE w.url = ?",
        (url,),
    ).fetchone()
    return None if need is None else int(need)
