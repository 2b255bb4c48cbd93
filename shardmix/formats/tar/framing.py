"""Tar framing errors: the messages that name a shard's URL, byte offset and member.

This module owns :class:`FramingErrors`, the part of :class:`~shardmix.formats.tar.members.
TarMembers` that words damage and truncation where the walk stands.
"""

from __future__ import annotations

from typing import NoReturn

from shardmix.errors import CorruptShardError, TruncatedShardError, describe_position
from shardmix.formats.sniff import format_hint
from shardmix.formats.tar.headers import BLOCK, padded


class FramingErrors:
    """Errors at the position of a member walk."""

    _url: str
    _gzipped: bool
    offset: int  # byte offset of the current header
    member: int  # number of the current member (its pax and long-name headers share it)
    name: str
    size: int

    def _where(self, offset: int, record: int | None = None) -> str:
        where = describe_position(self._url, record=record, offset=offset)
        return where + (" (in the decompressed stream)" if self._gzipped else "")

    def corrupt(
        self, what: str, offset: int | None = None, record: int | None = None, head: bytes = b""
    ) -> NoReturn:
        offset = self.offset if offset is None else offset
        remedy = self._other_format(head, offset) or (
            "the shard is damaged, re-create or re-download it"
        )
        raise CorruptShardError(
            f"{self._where(offset, record)}: {what}; {remedy}",
            url=self._url,
            offset=offset,
            record=record,
        )

    def _other_format(self, head: bytes, offset: int) -> str | None:
        """At offset 0, what to do when ``head`` looks like another format (else None)."""
        if offset or not head:
            return None
        return format_hint(head, "tar", self._gzipped, inflated=self._gzipped)

    def _truncated(self, what: str, offset: int, head: bytes = b"") -> NoReturn:
        remedy = self._other_format(head, offset) or (
            "the shard is truncated, re-create or re-download it"
        )
        raise TruncatedShardError(
            f"{self._where(offset)}: {what}; {remedy}",
            url=self._url,
            offset=offset,
        )

    def _member_cut(self, found: int) -> NoReturn:
        self._truncated(
            f"tar member {self.member} {self.name!r} (header at byte offset {self.offset}) "
            f"declares {self.size} bytes of data ({padded(self.size)} with padding) but the file "
            f"ends after {found}",
            self.offset + BLOCK + found,
        )

    def _block_cut(self, block: bytes) -> NoReturn:
        offset, found = self.offset, len(block)
        if found == 0 and offset == 0:
            self._truncated(
                "the tar shard is empty (0 bytes), without its end-of-archive blocks (even an "
                "archive with no members holds two 512-byte zero blocks)",
                offset,
            )
        if found == 0:
            self._truncated(
                f"the tar archive ends after {self.member + 1} members without its "
                "end-of-archive blocks (expected two 512-byte zero blocks)",
                offset,
            )
        self._truncated(f"expected a 512-byte tar header, found {found} bytes", offset, block)

    def error(self, what: str, *, record: int, offset: int | None = None) -> CorruptShardError:
        offset = self.offset if offset is None else offset
        return CorruptShardError(
            f"{self._where(offset, record)}: {what}; the shard is damaged, "
            "re-create or re-download it",
            url=self._url,
            offset=offset,
            record=record,
        )
