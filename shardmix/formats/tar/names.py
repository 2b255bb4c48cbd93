"""Tar member names: the webdataset rule that splits a name into a sample's key and field."""

from __future__ import annotations


def split_member_name(name: str) -> tuple[str, str] | None:
    """The ``(key, field)`` a member name stands for, or None when it is not part of a sample.

    >>> split_member_name("a/b/x.seg.PNG")
    ('a/b/x', 'seg.png')
    >>> split_member_name("a/b/.json")
    ('a/b/', 'json')
    >>> split_member_name("README") is None, split_member_name("__meta__/x.json") is None
    (True, True)
    """
    if name.startswith("__"):  # webdataset metadata: a first path part ``__like_this__``
        first, parted, _ = name.partition("/")
        if first.endswith("__") and (len(first) >= 4 or not parted):
            return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1:
        return name[:dot], name[dot + 1 :].lower()
    if dot == slash + 1 and slash >= 0:
        parent_start = name.rfind("/", 0, slash) + 1
        if "." not in name[parent_start:slash]:
            return name[: slash + 1], name[dot + 1 :].lower()
    return None
