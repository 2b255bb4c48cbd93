"""The accounts of a bounded shard cache: what it holds, who reads it, who needs what next.

One SQLite database per cache folder (:data:`LEDGER_NAME`), shared by every process on the
node: ``entries`` (copies ready or filling), ``leases`` (open readers), ``plans`` and ``wants``
(each reading plan's position and the shards it reads later). An owner is a process, named by
pid and start time. Each change is one ``BEGIN IMMEDIATE`` transaction, which also deletes the
files whose rows it drops: the accounts never say less than the disk holds, and what a dead
owner held is reclaimed. The policy is described in docs/remote-shards.md (a bounded cache).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from shardmix.errors import CacheFullError, ConfigError
from shardmix.sources.cache.store import DISK_FULL, unlink_if_there

__all__ = [
    "CacheLedger",
    "Entry",
    "LEDGER_NAME",
    "alive",
    "choose_victims",
    "ledger_for",
    "owner_of",
    "this_owner",
]

LEDGER_NAME = ".shardmix-cache.sqlite"
_BUSY_TIMEOUT_MS = 60_000
_WAL_PAGES = 32  # the log kept at 128 KiB: see the connection
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    path TEXT PRIMARY KEY, url TEXT NOT NULL, size INTEGER NOT NULL, state TEXT NOT NULL,
    owner TEXT, part TEXT, version TEXT, validator TEXT, mtime_ns INTEGER, sha256 TEXT,
    used INTEGER NOT NULL DEFAULT 0, total INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, path TEXT NOT NULL, owner TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS plans (plan TEXT PRIMARY KEY, owner TEXT NOT NULL, at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS wants (plan TEXT NOT NULL, url TEXT NOT NULL, position INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS wants_by_url ON wants (url, position);
CREATE INDEX IF NOT EXISTS leases_by_path ON leases (path);
"""
# The row of a copy an owner is filling (the arguments: path, owner).
_FILLING = "FROM entries WHERE path = ? AND owner = ? AND state = 'filling'"
# How many shards ahead the soonest live plan reads a URL (the query ends with it).
_NEED = "SELECT MIN(w.position - p.at) FROM wants w JOIN plans p ON p.plan = w.plan WHERE w.url ="


@dataclass(frozen=True)
class Entry:
    """A ready copy as the ledger records it."""

    path: str
    url: str
    size: int  # the bytes the copy holds: all of the shard, or its first ``size`` bytes
    total: int  # the shard's size
    version: str | None
    validator: str | None
    mtime_ns: int | None
    sha256: str | None


class CacheLedger:
    """The accounts of one cache folder, for this process (see the module's docstring)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.owner = this_owner()
        self.parent = owner_of(os.getppid())  # a ledger is one process's (see ledger_for)
        self.evictions = 0  # copies this process evicted
        self._lock = threading.Lock()  # one connection, shared by this process's threads
        self._connection: sqlite3.Connection | None = None
        try:
            os.makedirs(folder, exist_ok=True)
            self._create()
        except (OSError, sqlite3.OperationalError) as error:
            self._raise_named(error, None, "its tables")
        self.reclaim(check_files=True)

    def _create(self) -> None:
        """Open the database and make its tables, under an ``flock`` on the folder: two
        processes opening a new folder at once would otherwise race to switch the log on, and
        the loser, undoing what it began, would delete the winner's database under it."""
        database = os.path.join(self.folder, LEDGER_NAME)
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes
            existed = os.path.exists(database)
            try:
                with self._lock:
                    for statement in filter(str.strip, _SCHEMA.split(";")):
                        self._db.execute(statement)
            except (OSError, sqlite3.OperationalError):
                self.close()
                if not existed:  # a ledger this process began and could not finish: not left
                    for suffix in ("", "-wal", "-shm", "-journal"):
                        with contextlib.suppress(OSError):
                            os.unlink(database + suffix)
                raise
        finally:
            os.close(fd)

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection, opened on first use after :meth:`close` (caller locks)."""
        if self._connection is None:
            self._connection = sqlite3.connect(
                os.path.join(self.folder, LEDGER_NAME),
                timeout=_BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            self._connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            self._connection.execute("PRAGMA journal_mode = WAL")
            self._connection.execute("PRAGMA synchronous = NORMAL")
            # The log is moved into the database every _WAL_PAGES pages and cut back to that
            # size (SQLite's default, 1,000 pages, would let it grow to 4 MB, never shrunk).
            self._connection.execute(f"PRAGMA wal_autocheckpoint = {_WAL_PAGES}")
            self._connection.execute(f"PRAGMA journal_size_limit = {_WAL_PAGES * 4096}")
        return self._connection

    def close(self) -> None:
        """Close the connection (the next use opens another)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    @contextlib.contextmanager
    def _write(
        self, url: str | None = None, doing: str = "a change"
    ) -> Iterator[sqlite3.Connection]:
        """One write transaction, rolled back on any error (named by :meth:`_raise_named`)."""
        with self._lock:
            try:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as error:
                self._raise_named(error, url, doing)

    def _raise_named(self, error: Exception, url: str | None, doing: str) -> NoReturn:
        """Raise a :class:`CacheFullError` for a full disk, a :class:`ConfigError` for a folder
        this process cannot write (naming the shard ``url`` and what was being recorded)."""
        message = str(error).lower()
        code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+; the message before
        full = (code is not None and code & 0xFF == sqlite3.SQLITE_FULL) or "full" in message
        full = full or (isinstance(error, OSError) and error.errno in DISK_FULL)
        where = os.path.join(self.folder, LEDGER_NAME)
        if full:
            raise CacheFullError(
                f"{url or self.folder}: the disk of cache_dir {self.folder} is full: the cache's "
                f"ledger {where} could not record {doing} ({error}); nothing of it was kept: "
                "free space there, lower cache_limit to what the disk holds, or point cache_dir "
                "at a larger disk",
                url=url,
            ) from error
        unwritable = isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EROFS)
        unwritable = unwritable or any(
            words in message for words in ("unable to open", "readonly", "read-only")
        )
        if unwritable:
            raise ConfigError(
                f"cache_dir {self.folder} cannot be written by this process: the cache's ledger "
                f"{where} could not record {doing} ({error}); a bounded cache (cache_limit) "
                "keeps its accounts there: point cache_dir at a folder this process can write"
            ) from error
        raise error

    def _rows(self, query: str, *arguments: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(query, arguments))

    def lease(self, path: str, url: str) -> Entry | None:
        """A plan of this process reaches ``url``; the ready copy at ``path`` (None: none),
        leased in the same transaction so that no writer sees it unneeded and unleased."""
        with self._write() as db:
            self._reached(db, url)
            row = db.execute(
                "SELECT path, url, size, total, version, validator, mtime_ns, sha256 FROM entries "
                "WHERE path = ? AND state = 'ready'",
                (path,),
            ).fetchone()
            if row is None:
                return None
            db.execute("INSERT INTO leases (path, owner) VALUES (?, ?)", (path, self.owner))
            db.execute(
                "UPDATE entries SET used = (SELECT MAX(used) + 1 FROM entries) WHERE path = ?",
                (path,),
            )
        return Entry(*row)

    def release(self, path: str) -> None:
        """End one of this process's leases on ``path``."""
        with self._write() as db:
            db.execute(
                "DELETE FROM leases WHERE id = "
                "(SELECT MIN(id) FROM leases WHERE path = ? AND owner = ?)",
                (path, self.owner),
            )

    def discard(self, path: str) -> None:
        """Drop the copy at ``path`` (stale, or not the shard it should be): row and file."""
        with self._write() as db:
            db.execute("DELETE FROM entries WHERE path = ?", (path,))
            db.execute("DELETE FROM leases WHERE path = ?", (path,))
            unlink_if_there(path)

    def reserve(self, path: str, url: str, part: str, size: int, limit: int, minimum: int) -> int:
        """Reserve room for a copy of ``url`` (``size`` bytes) written to ``part``, evicting what
        the plans need later than ``url``: the bytes reserved, all ``size`` or at least
        ``minimum``; 0 when none (someone else fills it, or what is needed sooner or being
        read holds the limit)."""

        def attempt() -> int:
            with self._write(url, f"room for a copy of {size:,} bytes") as db:
                if db.execute("SELECT 1 FROM entries WHERE path = ?", (path,)).fetchone():
                    return 0
                (held,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()
                victims, freed = choose_victims(db, url, held + size - limit)
                kept = min(size, limit - held + freed)
                if kept < min(size, minimum):
                    return 0
                spare = limit - held + freed - kept  # what the last victim need not give up
                if victims and spare >= minimum:
                    trimmed, _ = victims.pop()
                    _trim(db, trimmed, spare)
                for victim, _ in victims:
                    db.execute("DELETE FROM entries WHERE path = ?", (victim,))
                    unlink_if_there(victim)
                self.evictions += len(victims)
                db.execute(
                    "INSERT INTO entries (path, url, size, total, state, owner, part, used) "
                    "VALUES (?, ?, ?, ?, 'filling', ?, ?, "
                    "(SELECT COALESCE(MAX(used), 0) + 1 FROM entries))",
                    (path, url, kept, size, self.owner, part),
                )
                return kept

        kept = attempt()
        if kept == size or not self.reclaim():
            return kept
        if kept:  # a part only: there may be room for more once the dead are reclaimed
            self.abandon(path)
        return attempt()

    def publish(
        self, path: str, url: str, filled: int, copy: tuple[str | None, str | None, str]
    ) -> os.stat_result:
        """Move this process's copy of ``url`` into place at ``path``, ready, validated by
        ``copy`` (version, validator, sha256); on a full disk neither copy nor row is kept.
        Returns the copy's status as it was put in place (another job may evict it at once)."""
        version, validator, sha256 = copy
        try:
            with self._write(url, f"the copy of {filled:,} bytes") as db:
                (part,) = db.execute(f"SELECT part {_FILLING}", (path, self.owner)).fetchone()
                os.replace(part, path)  # inside the transaction: a kill here leaves a filling row
                status = os.stat(path)
                db.execute(
                    "UPDATE entries SET state = 'ready', owner = NULL, part = NULL, size = ?, "
                    "version = ?, validator = ?, mtime_ns = ?, sha256 = ? WHERE path = ?",
                    (status.st_size, version, validator, status.st_mtime_ns, sha256, path),
                )
            return status
        except CacheFullError:
            unlink_if_there(path)  # moved into place, its row rolled back: the space it took, freed
            with contextlib.suppress(CacheFullError):
                self.abandon(path)
            raise

    def take_evictions(self) -> int:
        count, self.evictions = self.evictions, 0
        return count

    def abandon(self, path: str) -> None:
        """Give up this process's copy at ``path`` being filled: its temporary file first (on a
        full disk, what frees the room the row's deletion needs), then its row."""
        for (part,) in self._rows(f"SELECT part {_FILLING}", path, self.owner):
            unlink_if_there(part)
        with self._write(None, "a copy given up") as db:
            db.execute(f"DELETE {_FILLING}", (path, self.owner))

    def plan(self, plan: str, urls: Sequence[tuple[str, int]]) -> None:
        """Replace what ``plan`` reads later: ``(url, shards read before it)`` pairs."""
        with self._write() as db:
            db.execute("DELETE FROM wants WHERE plan = ?", (plan,))
            db.execute(
                "INSERT OR REPLACE INTO plans (plan, owner, at) VALUES (?, ?, 0)",
                (plan, self.owner),
            )
            db.executemany(
                "INSERT INTO wants (plan, url, position) VALUES (?, ?, ?)",
                [(plan, url, position) for url, position in urls],
            )

    def _reached(self, db: sqlite3.Connection, url: str) -> None:
        """A plan of this process or of its parent (a worker's main process) opens ``url``."""
        row = db.execute(
            "SELECT w.rowid, w.plan, w.position FROM wants w JOIN plans p ON p.plan = w.plan "
            "WHERE w.url = ? AND p.owner IN (?, ?) ORDER BY w.position LIMIT 1",
            (url, self.owner, self.parent),
        ).fetchone()
        if row is not None:
            db.execute("DELETE FROM wants WHERE rowid = ?", (row[0],))
            db.execute("UPDATE plans SET at = MAX(at, ?) WHERE plan = ?", (row[2], row[1]))

    def end_plan(self, plan: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM wants WHERE plan = ?", (plan,))
            db.execute("DELETE FROM plans WHERE plan = ?", (plan,))

    def reclaim(self, *, check_files: bool = False) -> bool:
        """Free what dead owners held (and rows of copies gone from disk); whether any was."""
        owners = self._rows(
            "SELECT owner FROM entries WHERE state = 'filling' UNION "
            "SELECT owner FROM leases UNION SELECT owner FROM plans"
        )
        dead = sorted(owner for (owner,) in owners if owner != self.owner and not alive(owner))
        ready = self._rows("SELECT path FROM entries WHERE state = 'ready'") if check_files else []
        gone = [path for (path,) in ready if not os.path.isfile(path)]
        if not dead and not gone:
            return False
        with self._write() as db:
            for owner in dead:
                parts = db.execute(
                    "SELECT path, part FROM entries WHERE owner = ? AND state = 'filling'", (owner,)
                ).fetchall()
                for path, part in parts:
                    db.execute("DELETE FROM entries WHERE path = ?", (path,))
                    unlink_if_there(part)
                    unlink_if_there(path)  # moved into place, its owner dead before marking it
                db.execute("DELETE FROM leases WHERE owner = ?", (owner,))
                db.execute(
                    "DELETE FROM wants WHERE plan IN (SELECT plan FROM plans WHERE owner = ?)",
                    (owner,),
                )
                db.execute("DELETE FROM plans WHERE owner = ?", (owner,))
            for path in gone:
                if not os.path.isfile(path):  # not a fresh copy written there since
                    db.execute("DELETE FROM entries WHERE path = ? AND state = 'ready'", (path,))
        return True

    def holds(self, path: str) -> bool:
        """Whether a ready copy of a whole shard is at ``path``."""
        query = "SELECT 1 FROM entries WHERE path = ? AND state = 'ready' AND size = total"
        return bool(self._rows(query, path))


def _trim(db: sqlite3.Connection, path: str, size: int) -> None:
    """Keep only the first ``size`` bytes of the copy at ``path`` (a part has no sha256)."""
    os.truncate(path, size)
    status = os.stat(path)
    db.execute(
        "UPDATE entries SET size = ?, mtime_ns = ?, sha256 = NULL WHERE path = ?",
        (status.st_size, status.st_mtime_ns, path),
    )


_LEDGERS: dict[tuple[int, str], CacheLedger] = {}
_LEDGERS_LOCK = threading.Lock()


def _close_before_fork() -> None:
    """SQLite connections must not cross a fork: close this process's (they reopen)."""
    with _LEDGERS_LOCK:
        for (pid, _), ledger in _LEDGERS.items():
            if pid == os.getpid():
                ledger.close()


os.register_at_fork(before=_close_before_fork)


def ledger_for(folder: str) -> CacheLedger:
    """This process's ledger of ``folder`` (a forked worker opens its own connection)."""
    key = (os.getpid(), os.path.abspath(folder))
    with _LEDGERS_LOCK:
        if key not in _LEDGERS:
            _LEDGERS[key] = CacheLedger(key[1])
        return _LEDGERS[key]


# Among the ready copies nobody reads: first those no live plan reads again this epoch, least
# recently used first; then those needed furthest ahead; never one needed sooner than the newcomer.
def choose_victims(
    db: sqlite3.Connection, url: str, needed: int
) -> tuple[list[tuple[str, int]], int]:
    """The copies to evict to free ``needed`` bytes for ``url``, and the bytes they free."""
    if needed <= 0:
        return [], 0
    rows = db.execute(
        f"SELECT e.path, e.size, e.used, ({_NEED} e.url) FROM entries e WHERE e.state = 'ready' "
        "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.path = e.path)"
    ).fetchall()
    (own,) = db.execute(f"{_NEED} ?", (url,)).fetchone()  # None: no live plan reads it
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


def _start_time(pid: int) -> str | None:
    """Process ``pid``'s start time in clock ticks since boot (None: none, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            fields = file.read().rpartition(")")[2].split()
    except OSError:
        return None
    if len(fields) <= 19 or fields[0] in ("Z", "X"):  # a zombie has ended: it holds nothing
        return None
    return fields[19]


_OWNER: tuple[int, str] | None = None


def this_owner() -> str:
    """This process as an owner of leases and plans: ``"<pid>:<start time>"``."""
    global _OWNER
    pid = os.getpid()
    if _OWNER is None or _OWNER[0] != pid:  # a forked worker is an owner of its own
        _OWNER = (pid, owner_of(pid))
    return _OWNER[1]


def owner_of(pid: int) -> str:
    """Process ``pid`` as an owner: ``"<pid>:<start time>"`` (``?`` where it cannot be told)."""
    return f"{pid}:{_start_time(pid) or '?'}"


def alive(owner: str) -> bool:
    """Whether the process ``owner`` names still runs (the same process, not its pid reused)."""
    pid_text, _, start = owner.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if start != "?":
        return _start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    return True
