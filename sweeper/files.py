"""Writing a file so that readers see the old content or the new one, never a part: the one way files are written.

Temp file beside the target (a leading dot, so Parquet datasets and globs skip it), fsync,
rename over the target, fsync the folder; the temp file is removed on any failure. OSError
reaches the caller, which knows what the file was for and words the error.

What is written as it goes (a log, a process's output) goes through `open_own` and `own_dir`:
a link at the name is replaced, never written through, like the rename above replaces one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(
    path: Path, write: Callable[[Path], object], *, tmp_dir: Path | None = None, private: bool = True
) -> None:
    """Call `write(tmp)` to fill a temp file, then put it in place of `path` atomically.

    `tmp_dir` (same file system) keeps the temp file out of the target's folder, for readers that
    refuse a folder holding anything else (Polars reading a Parquet dataset). `private`: 0600, as
    everything a results folder holds for the tool; a file written for the user to read or share
    (a plan, a report) takes the mode any new file gets (0666 less the umask: 0644 usually).
    """
    tmp = (tmp_dir or path.parent) / f".{path.name}.{os.getpid()}.tmp"
    try:
        if tmp_dir is not None:
            tmp_dir.mkdir(exist_ok=True)
        tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
        write(tmp)
        os.chmod(tmp, 0o600 if private else 0o666 & ~_umask())  # a results folder is its owner's alone
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes, *, private: bool = True) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data), private=private)


def atomic_write_text(path: Path, text: str, *, private: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), private=private)


def _umask() -> int:
    """The process's umask (reading it means setting it: put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (the folder's entry, not only the file's data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def own_dir(path: Path) -> Path:
    """A folder of the tool's own at `path` (made 0700 when missing): a link there is removed and
    replaced by the folder, never followed (a copied results folder may hold one)."""
    if path.is_symlink():
        path.unlink()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def open_own(path: Path, *, append: bool = False) -> BinaryIO:
    """Open a file of the tool's own for writing, never through a link: a symbolic link, a hard
    link or anything but a plain file at `path` is removed first (the file starts anew), and
    O_NOFOLLOW refuses a link put there in between."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or not append):
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_EXCL)
    return os.fdopen(os.open(path, flags, 0o600), "ab" if append else "wb")
