"""Folder inputs: files that share a path stem form one sample.

The naming rule, class subfolders and links: docs/design/convert.md, "Folder inputs".
"""

from __future__ import annotations

import os

from shardmix.convert.inputs import BadInputError, FileItem, Problems, check_field, check_key
from shardmix.convert.options import LabelMode
from shardmix.errors import ConfigError

Found = tuple[str | None, FileItem]  # a sample's class name (before it becomes a label), files


def split_name(name: str) -> tuple[str, str] | None:
    """``(stem, field)`` of a file name, or None for hidden and extension-less names.

    >>> split_name("img001.Seg.PNG"), split_name("README"), split_name(".hidden.txt")
    (('img001', 'seg.png'), None, None)
    """
    dot = name.find(".")
    if dot <= 0 or dot == len(name) - 1:
        return None
    return name[:dot], name[dot + 1 :].lower()


class _Walker:
    """Walks one input folder in sorted order and groups its files into samples."""

    def __init__(self, root: str, follow_links: bool, problems: Problems) -> None:
        self.root = os.path.abspath(root)
        self.real_root = os.path.realpath(root)
        self.follow_links = follow_links
        self.problems = problems
        self.visited: set[str] = set()

    def entries(self, folder: str) -> tuple[list[os.DirEntry[str]], list[os.DirEntry[str]]]:
        """The visible files and subfolders of ``folder``, sorted by name."""
        try:
            with os.scandir(folder) as scan:
                entries = sorted(scan, key=lambda entry: entry.name)
        except OSError as error:
            self.problems.report(
                BadInputError(f"{folder}: cannot list the folder: {error}", url=folder)
            )
            return [], []
        files, folders = [], []
        for entry in entries:
            if entry.name.startswith("."):
                self.problems.left_out["hidden name"] += 1
                continue
            if entry.is_symlink() and not self.link_allowed(entry):
                continue
            if entry.is_dir():
                folders.append(entry)
            elif entry.is_file():
                files.append(entry)
            else:
                self.problems.left_out["not a regular file"] += 1
        return files, folders

    def link_allowed(self, entry: os.DirEntry[str]) -> bool:
        real = os.path.realpath(entry.path)
        if self.follow_links:
            if real in self.visited:
                self.problems.left_out["link to a file or folder already listed"] += 1
                return False
            self.visited.add(real)
            return True
        if real != self.real_root and not real.startswith(self.real_root + os.sep):
            self.problems.report(
                BadInputError(
                    f"{entry.path}: the link leads out of the input folder {self.root} "
                    "(pass --follow-links to follow it)",
                    url=entry.path,
                )
            )
            return False
        if entry.is_dir():  # a folder link inside the root would be walked twice
            self.problems.left_out["link to a folder inside the input"] += 1
            return False
        return True

    def walk(self, folder: str, class_name: str | None, labels: bool) -> list[Found]:
        files, folders = self.entries(folder)
        groups = self.group(files, class_name)
        for sub in folders:
            name = class_name if class_name is not None or not labels else sub.name
            groups.extend(self.walk(sub.path, name, labels))
        return groups

    def group(self, files: list[os.DirEntry[str]], class_name: str | None) -> list[Found]:
        by_stem: dict[str, list[tuple[str, str, int]]] = {}
        for entry in files:
            parts = split_name(entry.name)
            if parts is None:
                self.problems.left_out["no extension"] += 1
                continue
            try:
                size = entry.stat().st_size
            except OSError as error:
                self.problems.report(
                    BadInputError(f"{entry.path}: cannot read the file: {error}", url=entry.path)
                )
                continue
            by_stem.setdefault(parts[0], []).append((parts[1], entry.path, size))
        return [
            group
            for stem, members in by_stem.items()
            if (group := self.make_group(stem, members, class_name)) is not None
        ]

    def make_group(
        self, stem: str, members: list[tuple[str, str, int]], class_name: str | None
    ) -> Found | None:
        first = members[0][1]
        relative = os.path.relpath(os.path.join(os.path.dirname(first), stem), self.root)
        try:
            key = check_key(relative.replace(os.sep, "/"), first)
            fields = [check_field(field, path) for field, path, _ in members]
            if len(set(fields)) != len(fields) or (class_name is not None and "cls" in fields):
                raise BadInputError(
                    f"{first}: the files of sample {key!r} repeat a field (names differing only "
                    f"in case, or a .cls file where the folder gives the class): {fields}",
                    url=first,
                )
        except BadInputError as error:
            self.problems.report(error)
            return None
        _, paths, sizes = zip(*members, strict=True)
        return class_name, FileItem(key, first, tuple(fields), sizes, paths)


def list_folder(
    root: str, labels: LabelMode, follow_links: bool, problems: Problems
) -> tuple[list[Found], list[str]]:
    """The samples of one folder input and its class names (empty without labels)."""
    if not os.path.isdir(root):
        problems.report(BadInputError(f"{root}: no such folder", url=root))
        return [], []
    with os.scandir(root) as scan:
        visible = [entry for entry in scan if not entry.name.startswith(".")]
    class_layout = bool(visible) and all(entry.is_dir() for entry in visible)
    if labels is LabelMode.SUBFOLDER and not class_layout:
        raise ConfigError(
            f"{root}: labels='subfolder' needs every file in a class subfolder, but the folder "
            "holds files directly (pass --labels none)"
        )
    use_labels = labels is LabelMode.SUBFOLDER or (labels is LabelMode.AUTO and class_layout)
    walker = _Walker(root, follow_links, problems)
    groups = walker.walk(walker.root, None, use_labels)
    return groups, sorted(entry.name for entry in visible) if use_labels else []
