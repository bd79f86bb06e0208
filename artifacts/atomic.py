"""Atomic file writes and content hashes.

Contract: a reader never sees a half-written file. Every writer here writes to a temporary file
in the destination's directory (same filesystem, so the final ``os.replace`` is atomic). It fsyncs
the file, renames it over the destination, and fsyncs the directory so the rename itself survives
a crash. On any error the temporary file is removed and an existing file at the destination is
left untouched. Parent directories are created as needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "fsync_tree",
    "sha256_bytes",
    "sha256_file",
]

_CHUNK = 1 << 20

# mkstemp creates files with mode 0600; a finished artifact should get the same mode as a file
# made by open(), i.e. 0666 minus the umask. The umask can only be read by setting it, so read it
# once at import (before any threads of ours exist) rather than racing other threads later.
_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of the file's bytes, read in 1 MiB chunks (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    # Persist the directory entry created by os.replace; without this a crash right after the
    # rename can bring back the old file (or no file) on some filesystems.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms where directories cannot be opened
        return
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory; the rename stands
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """Flush every file under `root`, then every directory from the deepest up, to disk. For a directory that
    libraries which do not fsync (safetensors, save_pretrained) wrote, before a rename publishes it."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(directory))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on normal exit it replaces ``path``.

    For libraries that insist on writing to a filename (pyarrow, safetensors, torch.save): write
    to the yielded path inside the ``with`` block. On normal exit the temporary file is fsynced
    and renamed over ``path``; if the block raises, the temporary file is removed, ``path`` is
    untouched and the exception propagates. The yielded file already exists (empty), which
    reserves the name; writing nothing to it produces an empty file at ``path``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # The library may not have fsynced; the data must be on disk before the rename is.
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to ``path`` atomically (see module docstring)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically, encoded with ``encoding`` (UTF-8 by default)."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON (sorted keys, indent 1, trailing newline) atomically.

    Sorted keys make the bytes a function of the content only, so equal objects hash equal.
    """
    atomic_write_text(path, json.dumps(obj, sort_keys=True, indent=1) + "\n")


def check_writable(where: str | os.PathLike[str]) -> None:
    """Raise OSError unless files can be created at `where` (a dir that may not exist yet): a temp dir is
    created and removed in its nearest existing parent."""
    parent = Path(where).absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{parent} is a file")
    Path(tempfile.mkdtemp(prefix=".rollflow-write-check-", dir=parent)).rmdir()
