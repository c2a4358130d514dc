"""One writer per folder: an advisory lock (``fcntl.flock``) on ``FOLDER/.lock``, which names its holder's pid.

``hyla train`` holds one on each run directory it trains, ``hyla sweep`` one on the sweep's folder and one on each
run directory while that run trains, so a second command on the same folder stops at once (naming the first)
instead of training the same steps beside it. The kernel drops a flock when its process ends, however it ends
(``kill -9`` included), so a lock file a dead process left behind holds nothing and is simply taken over. A
holder that ends normally removes the file, which is never part of a run's record.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

#: the lock file in a locked folder: a dot file, so that ``DIR/*`` globs (``hyla report DIR/*``) pass it by
LOCK_FILE = ".lock"


class FolderInUseError(ValueError):
    """Another live process holds the folder's lock; ``pid`` is the holder's (``None``: not written yet)."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


def lock_holder(folder: Path) -> tuple[int | None, str]:
    """The pid and the command that a lock file names (``None, ""`` when absent or not yet written)."""
    try:
        pid, _, command = (Path(folder) / LOCK_FILE).read_text().strip().partition(" ")
        return int(pid), command
    except (OSError, ValueError):
        return None, ""


class FolderLock:
    """``with FolderLock(folder, "hyla sweep"):`` holds ``folder``'s lock (made if need be) or raises
    ``FolderInUseError`` at once; a folder made only to hold the lock is removed again if left empty.
    ``what`` names the folder in the error when it cannot be made."""

    def __init__(self, folder: Path, command: str, what: str = "the folder") -> None:
        self.folder, self.command, self.what = Path(folder), command, what
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None
        self._made_folder = False

    def acquire(self) -> None:
        self._made_folder = not self.folder.exists()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file in the way, no permission: the user's path
            raise ValueError(f"cannot make {self.what} {self.folder} ({err.strerror}); choose another place") from err
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise ValueError(f"cannot write the lock file {self.path} ({err.strerror})") from err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self._forget_folder()
                pid, command = lock_holder(self.folder)
                who = f"pid {pid} ({command or 'unknown command'})" if pid is not None else "another process"
                raise FolderInUseError(
                    f"{self.folder} is in use by {who}, which holds {self.path}; one writer at a time: "
                    "wait for it to end or stop it",
                    pid,
                ) from None
            # a holder removes the file as it ends: if it did so after we opened it, our lock is on a file that no
            # one else finds, so lock the file now at the path instead
            try:
                here, there = os.fstat(fd), os.stat(self.path)
                same = (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.command}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # removed while still held, so that no one takes a lock on a file about to vanish
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None
        self._forget_folder()

    def _forget_folder(self) -> None:
        if self._made_folder:
            with contextlib.suppress(OSError):  # not empty (the run wrote to it) or already gone: keep it
                self.folder.rmdir()
            self._made_folder = False

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
