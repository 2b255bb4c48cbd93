"""Tar record damage: what a read of records does with a damaged record or lost framing.

This module owns :class:`RecordDamage`, the part of :class:`~shardmix.formats.tar.records.
TarRecords` that words a damaged member's error and, with a damage handler, holds a record's
damage until the record ends and reports it with the bytes it spanned (else raises at once).
"""

from __future__ import annotations

from shardmix.errors import CorruptShardError, ShardmixError
from shardmix.formats.tar.headers import Member
from shardmix.formats.tar.members import TarMembers
from shardmix.policy import Damage, DamageHandler


class RecordDamage:
    """The records begun so far in one tar stream, and the damage of the one in progress."""

    def __init__(
        self, members: TarMembers, max_member_bytes: int, on_damage: DamageHandler | None
    ) -> None:
        self.members = members
        self._max_member_bytes = max_member_bytes
        self._on_damage = on_damage
        self.records = 0  # records begun so far
        self.cut_at: int | None = None  # the first record lost with the framing, if reported
        self._record_offset = 0  # offset of the current record's first entry
        self._damage: CorruptShardError | None = None  # of the current record, not yet reported

    def _misnamed(self, field: str, record: int, member: Member) -> CorruptShardError:
        _, offset, number, name, _, _ = member
        if field.startswith("__"):
            return self.members.error(
                f"tar member {number} {name!r} has field {field!r}: field names starting with "
                "__ are reserved for shardmix's provenance keys (__key__, __source__, "
                "__index__, __offset__); rename the member",
                record=record,
                offset=offset,
            )
        hint = ""
        if "." in field:
            key = name[: len(name) - len(field) - 1]
            hint = (
                f" (a key ends at the first dot of a member's base name, so {name!r} is field "
                f"{field!r} of key {key!r}: a key holding a dot splits there; write keys "
                "without dots)"
            )
        return self.members.error(
            f"tar member {number} {name!r} repeats field {field!r} of its sample{hint}",
            record=record,
            offset=offset,
        )

    def _too_large(self, record: int, member: Member) -> CorruptShardError:
        _, offset, number, name, size, _ = member
        return self.members.error(
            f"tar member {number} {name!r} declares {size} bytes of data, more than "
            f"max_member_bytes={self._max_member_bytes} (raise max_member_bytes if the shard "
            "really holds members this large)",
            record=record,
            offset=offset,
        )

    def _damaged(self, error: CorruptShardError, record: int, start: int) -> None:
        """A record with intact framing is damaged: raise, or drop it (reported when it ends;
        not at all before ``start``, where the record is not being read)."""
        if self._on_damage is None:
            raise error
        if record >= start and self._damage is None:
            self._damage = error

    def _end_record(self, record: int, end: int) -> None:
        """Report the damage of the record that just ended at byte ``end``."""
        error, self._damage = self._damage, None
        if error is not None and self._on_damage is not None:
            size = end - self._record_offset
            self._on_damage(Damage(error, record, self._record_offset, size))

    def _lost(self, error: ShardmixError, record: int, start: int) -> bool:
        """The framing is lost in ``record``: whether to raise (else the rest was reported)."""
        if self._on_damage is None or not isinstance(error, CorruptShardError):
            return True
        if self.members.ended:  # junk after the end: every record is whole, the last one too
            self._end_record(record, self.members.entry_offset)
            record += 1
            offset = error.offset
        else:
            pending, self._damage = self._damage, None
            if pending is not None:  # report the record's own damage too
                size = self.members.offset - self._record_offset
                self._on_damage(Damage(pending, record, self._record_offset, size))
            offset = self._record_offset if record >= 0 else error.offset
        self.cut_at = max(record, 0)
        self._on_damage(Damage(error, max(record, start, 0), offset, rest_of_shard=True))
        return False
