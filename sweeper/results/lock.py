"""One `sweep run` per sweep at a time: an advisory lock on a file in the results folder."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from sweeper.errors import SweepError


class SweepLock:
    """Held for the life of a `sweep run`; the kernel releases it if the process dies."""

    def __init__(self, root: Path) -> None:
        self.path = root / "run.lock"
        self._fd: int | None = None

    def __enter__(self) -> SweepLock:
        from sweeper.results.folder import make_private

        make_private(self.path.parent)
        try:  # O_NOFOLLOW: a link planted as run.lock is refused, not written through
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise SweepError(f"cannot open the lock {self.path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise SweepError(
                f"another `sweep run` is running this sweep ({holder}; lock {self.path}); "
                "wait for it, or stop it first. `sweep status` and `sweep best` work meanwhile"
            ) from None
        try:  # who holds it, for the message above; a full disk may refuse even these few bytes
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode())
        except OSError:
            pass
        self._fd = fd
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
