"""Writing a run's files so that a disk fault ends cleanly: atomically (a temporary file, fsync,
rename, fsync of the directory), leaving no temporary file behind when the write fails, and failing
with one line that names what was being written and where (:class:`WriteFailed`). A full disk, a
read-only or a vanished run directory all end this way, whichever file met them first. Torch-free:
the trace writer and the launcher use it too."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class WriteFailed(OSError):
    """A file of the run could not be written: ``what`` (the trace, a checkpoint, the metrics, the
    summary...) at ``path``, and the system's reason. ``str()`` is the whole one-line message."""

    def __init__(self, what: str, path: Path | str, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        super().__init__(exc.errno, f"cannot write {what} to {path}: {reason}", str(path))
        self.what, self.path, self.reason = what, Path(path), reason

    def __str__(self) -> str:
        return str(self.strerror)


def write_durable(path: Path, data: bytes, what: str = "file") -> None:
    """Atomic and durable: a crash at any point leaves either the old file or the whole new one; a
    failed write (WriteFailed) leaves the old file and no temporary one. Whatever is serialised
    (torch.save, np.savez) is serialised to bytes first, so only the system's errors happen here."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):  # a full disk must not stay full of a half-written file
                tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
    except OSError as exc:
        raise WriteFailed(what, path, exc) from exc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
