"""Atomic file writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from foxhunt.errors import FoxhuntError


def fsync_dir(path: Path) -> None:
    """Flush a directory entry so a rename inside it survives a power loss."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _read_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it; set straight back (once, at import)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_read_umask()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temp file in the same directory, fsync it, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:  # named by the temp file's name, which the user never gave
        if err.errno is None:
            raise
        raise type(err)(err.errno, err.strerror, str(path)) from err
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask) so
        # run files stay readable by whoever the user's umask allows, like every other file.
        if hasattr(os, "fchmod"):  # POSIX
            os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object; any other content is a one-line FoxhuntError."""
    if not path.is_file():
        raise FoxhuntError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FoxhuntError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise FoxhuntError(f"{path} must hold a JSON object, got: {type(data).__name__}")
    return data


def shell_quoted(path: object) -> str:
    """A path as a shell reads it, for the commands foxhunt's messages suggest (a run
    directory with a space in its name must stay one argument when pasted)."""
    import shlex

    return shlex.quote(str(path))
