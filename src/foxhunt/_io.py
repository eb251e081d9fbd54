"""Atomic file writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

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
_T = TypeVar("_T")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temp file in the same directory, fsync it, then ``os.replace``."""
    atomic_write_many({Path(path): data})


def atomic_write_many(files: Mapping[Path, bytes]) -> None:
    """Write several files all or nothing: every temp file is written and fsync-ed before the
    first rename, so a write error (a full disk part way) leaves every previous file as it was,
    never a new file beside an old one. Only a crash or a failing rename between the renames
    (no data left to write by then) can mix them."""
    temps: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = _named(
                path, tempfile.mkstemp, dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
            )
            temps.append((tmp, path))
            # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask)
            # so run files stay readable by whoever the user's umask allows.
            if hasattr(os, "fchmod"):  # POSIX
                os.fchmod(fd, _FILE_MODE)
            _named(path, _write_and_sync, fd, data)
        for tmp, path in temps:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for parent in dict.fromkeys(path.parent for _, path in temps):
        fsync_dir(parent)


def _write_and_sync(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _named(path: Path, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``, its OSError naming ``path``: the temp file's name is one the
    user never gave, and a full disk's ENOSPC (raised by write or fsync) names no file."""
    try:
        return fn(*args, **kwargs)
    except OSError as err:
        if err.errno is None:
            raise
        raise type(err)(err.errno, err.strerror, str(path)) from err


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
