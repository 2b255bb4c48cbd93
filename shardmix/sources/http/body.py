"""An HTTP answer's body read straight into the caller's buffer, what has arrived of it.

urllib3's ``read1`` (the read of what has arrived, which the stall check needs) allocates a
bytes object as large as the read asked for (a read-ahead block's 4 MB), has one receive fill
part of it, shrinks it, and the caller copies it again: fresh memory, page faults and a copy
for every receive. :func:`read_into` instead has the answer's buffered socket file receive once
(``readinto1``) into the caller's buffer, and keeps ``http.client``'s count of the body's bytes
left, closing the answer at its end as ``http.client`` does, so that its connection can carry
the next request. An answer of another shape (a chunked or encoded body, one of unknown length,
a client library that wraps it differently) is read with ``read1`` as before.

Left to others: what a read means for the stream (retries, the stall check, the bytes counted:
:class:`~shardmix.sources.http.stream.HttpShardStream`).
"""

from __future__ import annotations

import http.client

import urllib3

__all__ = ["read_into"]


def read_into(response: urllib3.BaseHTTPResponse, view: memoryview) -> int:
    """Receive up to ``len(view)`` bytes of ``response``'s body into ``view``, at most one
    receive from the socket (what has arrived, or the first bytes to arrive); 0 at the end of
    the body, or when the connection ended it."""
    answer = _direct(response)
    if answer is None:
        chunk = response.read1(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)
    file, left = answer.fp, answer.length
    if file is None or left is None:  # closed here, at the end of its body
        return 0
    count: int = file.readinto1(view[:left] if len(view) > left else view)
    left -= count
    answer.length = left
    if not count or not left:
        answer.close()  # as http.client does at the body's end: the connection may go on
    return count


def _direct(response: urllib3.BaseHTTPResponse) -> http.client.HTTPResponse | None:
    """The ``http.client`` answer under ``response`` when its body can be received into a
    caller's buffer: of known length, neither chunked nor decoded, on a buffered socket file
    (or closed at its end by :func:`read_into`); else None."""
    answer = getattr(response, "_fp", None)
    if not isinstance(answer, http.client.HTTPResponse) or response.decode_content:
        return None
    if answer.chunked or (answer.length is None and answer.fp is not None):
        return None
    return answer if answer.fp is None or hasattr(answer.fp, "readinto1") else None
