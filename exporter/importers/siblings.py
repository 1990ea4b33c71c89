"""The files beside an artifact (rocprof companions, ``.meta.json`` sidecars), read under the
``safefile`` rule through the artifact's own directory fd: never by path, never a symlink,
never more than the limit."""

from __future__ import annotations

import os

from .. import safefile


class Siblings:
    def __init__(self, dir_fd: int | None, limit: int, *, single_link: bool = False) -> None:
        self.dir_fd, self.limit, self.single_link = dir_fd, limit, single_link

    def names(self) -> list[str]:
        if self.dir_fd is None:
            return []
        try:
            return sorted(os.listdir(self.dir_fd))
        except OSError:
            return []

    def exists(self, name: str) -> bool:
        if self.dir_fd is None:
            return False
        try:
            os.lstat(name, dir_fd=self.dir_fd)
        except OSError:
            return False
        return True

    def read(self, name: str, limit: int | None = None) -> bytearray | None:
        """The content of ``name``; None when there is no such entry.  Raises OSError
        (``safefile.Refused`` with the reason) for one that is not read."""
        if self.dir_fd is None:
            return None
        try:
            return safefile.read_at(self.dir_fd, name, self.limit if limit is None else limit,
                                    single_link=self.single_link)
        except FileNotFoundError:
            return None

    def read_text(self, name: str) -> str | None:
        data = self.read(name)
        return None if data is None else data.decode("utf-8", errors="replace")
