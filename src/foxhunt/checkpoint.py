"""Checkpoint storage: safetensors + JSON + a hashed manifest, written atomically, verified on load.

A checkpoint is a directory::

    step-000000012345/
        tensors.safetensors   every tensor (model, target, optimizer, replay, ...), CPU, contiguous
        state.json            config, counters, RNG states: anything JSON-able
        manifest.json         format name/version, sha256 + size of both files, the tensor table

Why a directory and a manifest: the tensors and the JSON state must be restored *together* for an
exact resume, and a checkpoint that was half written, truncated, edited or swapped must be refused
with a message that names the broken file instead of silently resuming from garbage.

Trust nothing on load: files are hashed before anything is returned, the safetensors header is
parsed and checked against the manifest here (so errors name the key), and nothing is ever
unpickled - a ``torch.save`` archive or a raw pickle is recognised and refused without executing it.

Atomicity: a checkpoint is built in a ``.tmp-*`` sibling directory, every file and the directory
are fsync-ed, and only then is it renamed to its final name, so no partial directory ever carries a
final name. Replacing an existing checkpoint renames the old one to ``.old-<name>-<token>`` first,
then renames the new one in, then deletes the old one: a crash at any point leaves the old or the
new complete checkpoint on disk (see :func:`save_checkpoint`).

:class:`CheckpointManager` adds a run directory with ``latest.json`` (an atomically replaced
pointer), ``keep_last`` pruning, stale-temporary cleanup and fallback to the newest checkpoint
that verifies. Only one process may write to a run directory at a time; saves take an advisory
lock to enforce it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import inspect
import json
import math
import os
import re
import shutil
import stat
import struct
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch as _st
import torch
from safetensors import SafetensorError

from foxhunt._io import _FILE_MODE
from foxhunt.errors import CheckpointError, ConfigError, first_line

try:  # POSIX advisory locks; on other platforms saves are not guarded against a second writer.
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - Windows
    _fcntl = None  # type: ignore[assignment]

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "STATE_FILE",
    "SUPPORTED_DTYPES",
    "TENSORS_FILE",
    "CheckpointManager",
    "CheckpointWarning",
    "load_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]

FORMAT_NAME = "foxhunt-checkpoint"
FORMAT_VERSION = 1
TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
MANIFEST_FILE = "manifest.json"
_DATA_FILES = (TENSORS_FILE, STATE_FILE)
_MANIFEST_KEYS = {"format", "format_version", "files", "tensors", "created"}
_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"
_MAX_MANIFEST_BYTES = 16 * 2**20
_MAX_HEADER_BYTES = 100 * 2**20  # the limit safetensors itself enforces
_CHUNK = 4 * 2**20

# torch dtype -> (manifest name, safetensors code, item size in bytes)
_DTYPES: dict[torch.dtype, tuple[str, str, int]] = {
    torch.float32: ("float32", "F32", 4),
    torch.float64: ("float64", "F64", 8),
    torch.float16: ("float16", "F16", 2),
    torch.bfloat16: ("bfloat16", "BF16", 2),
    torch.int64: ("int64", "I64", 8),
    torch.int32: ("int32", "I32", 4),
    torch.uint8: ("uint8", "U8", 1),
    torch.bool: ("bool", "BOOL", 1),
}
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = tuple(_DTYPES)
_NAME_TO_DTYPE = {name: dt for dt, (name, _, _) in _DTYPES.items()}
_CODE_TO_NAME = {code: name for name, code, _ in _DTYPES.values()}
_ITEMSIZE = {name: size for name, _, size in _DTYPES.values()}

# safetensors >= 0.6 can read tensors with pread into memory torch owns; the default mmap backend
# would alias the file (a later truncation could SIGBUS, an edit would change "verified" tensors).
_HAS_PREAD = "backend" in inspect.signature(_st.load_file).parameters


class CheckpointWarning(RuntimeWarning):
    """A checkpoint was skipped or a pointer ignored; loading continued with an older one."""


# --------------------------------------------------------------------------- small helpers


def _fail(path: Path, message: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path}: {message}")


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPES[dtype][0] if dtype in _DTYPES else str(dtype).removeprefix("torch.")


def _fmt_spec(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}{list(shape)}"


def _fsync_dir(path: Path) -> None:
    """Persist a directory entry (a rename or a new file) - without it a crash can undo a rename."""
    if os.name == "nt":  # pragma: no cover - directories cannot be opened on Windows
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _token() -> str:
    return uuid.uuid4().hex


def _remove_tree(path: Path) -> None:
    """Delete a directory so that no partially deleted tree ever keeps a checkpoint's name."""
    trash = path.with_name(f"{_TMP_PREFIX}trash-{path.name.lstrip('.')}-{_token()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _parse_json(data: bytes, path: Path, what: str) -> Any:
    """Strict JSON: UTF-8, no control characters in strings, no duplicate keys."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(path, f"{what} is not valid JSON ({first_line(exc)})") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_json_value(value: Any, where: str, active: set[int]) -> None:
    """Refuse what JSON would silently change (tuples, non-str keys) or cannot store at all."""
    if value is None or isinstance(value, bool | int | float | str):
        return
    if isinstance(value, dict | list):
        if id(value) in active:
            raise ValueError(f"{where} contains itself (circular reference)")
        active.add(id(value))
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"{where} has key {key!r} of type {type(key).__name__}; "
                        "JSON keys must be strings"
                    )
                _check_json_value(item, f"{where}[{key!r}]", active)
        else:
            for i, item in enumerate(value):
                _check_json_value(item, f"{where}[{i}]", active)
        active.discard(id(value))
        return
    hint = "; JSON would turn it into a list, convert it first" if isinstance(value, tuple) else ""
    raise TypeError(f"{where} is a {type(value).__name__}, which is not JSON-able{hint}")


def _sniff_pickle(head: bytes) -> str | None:
    """Name the format of a file that is a pickle or a torch.save archive, else None."""
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (torch.save format, which holds a pickle)"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return f"a pickle (protocol {head[1]})"
    return None


# --------------------------------------------------------------------------- saving


def _prepare_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies: safetensors needs contiguous unshared storage, and a copy
    keeps the file equal to the values at call time even if the caller reuses its buffers."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of str to torch.Tensor, got {type(tensors)}")
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if not isinstance(key, str) or not key or key == "__metadata__":
            raise ValueError(f"tensor key {key!r} is not allowed (non-empty str, not __metadata__)")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensors[{key!r}] is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.dtype not in _DTYPES:
            supported = ", ".join(name for name, _, _ in _DTYPES.values())
            raise TypeError(
                f"tensors[{key!r}] has dtype {_dtype_name(tensor.dtype)}; supported: {supported}"
            )
        if tensor.layout != torch.strided:
            raise TypeError(f"tensors[{key!r}] has layout {tensor.layout}; only dense tensors")
        out[key] = tensor.detach().to(
            device="cpu", copy=True, memory_format=torch.contiguous_format
        )
    return out


def _hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _old_siblings(path: Path) -> list[Path]:
    """Previous versions of ``path`` parked by an interrupted or unfinished replace."""
    pattern = re.compile(rf"^{re.escape(_OLD_PREFIX + path.name)}-[0-9a-f]{{32}}$")
    if not path.parent.is_dir():
        return []
    return sorted(p for p in path.parent.iterdir() if pattern.match(p.name))


def _os_metadata(name: str) -> bool:
    """Files a file browser drops into any folder it shows (macOS, Windows): never data."""
    return name in (".DS_Store", "Thumbs.db", "desktop.ini") or name.startswith("._")


def foreign_files(path: Path) -> list[str]:
    """The names in checkpoint directory ``path`` that no checkpoint writes (file browsers'
    metadata aside): what a save must not replace, nor a load accept."""
    return sorted(
        entry.name
        for entry in path.iterdir()
        if entry.name not in (*_DATA_FILES, MANIFEST_FILE) and not _os_metadata(entry.name)
    )


def _replaceable(path: Path) -> bool:
    """Only ever replace something that is (or was meant to be) a checkpoint, never user data."""
    if not path.is_dir() or path.is_symlink():
        return False
    return not foreign_files(path)


def save_checkpoint(
    path: Path, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]
) -> Path:
    """Write a checkpoint directory at ``path`` atomically and return ``path``.

    The checkpoint is assembled in ``.tmp-<name>-<token>`` beside ``path`` and renamed into place
    after every file and the directory are fsync-ed. If ``path`` already holds a checkpoint it is
    replaced: old renamed to ``.old-<name>-<token>``, new renamed in, old deleted. A crash between
    the two renames leaves the old checkpoint complete under the ``.old-`` name (the error of
    :func:`load_checkpoint` names it; :class:`CheckpointManager` restores it). Anything at ``path``
    that is not a checkpoint directory is refused, never overwritten.

    ``state`` must be JSON-able as is: str keys; None/bool/int/float/str/list/dict values. Tuples
    and non-str keys are refused because JSON would silently change them and break exact resume.
    """
    path = Path(path)
    if path.name.startswith((_TMP_PREFIX, _OLD_PREFIX)) or path.name in ("", ".", ".."):
        raise CheckpointError(f"checkpoint name {path.name!r} is reserved or empty: {path}")
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    _check_json_value(dict(state), "state", set())
    prepared = _prepare_tensors(tensors)
    state_bytes = json.dumps(dict(state), ensure_ascii=True, allow_nan=True).encode("ascii")
    if path.is_symlink() or (path.exists() and not _replaceable(path)):
        raise CheckpointError(
            f"refusing to replace {path}: it exists and is not a foxhunt checkpoint directory"
        )

    parent = path.parent
    tmp = parent / f"{_TMP_PREFIX}{path.name}-{_token()}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(tmp)
        tensors_path = tmp / TENSORS_FILE
        _st.save_file(prepared, str(tensors_path))
        os.chmod(tensors_path, _FILE_MODE)  # safetensors creates 0600; the run's other files not
        with open(tensors_path, "rb+") as f:
            os.fsync(f.fileno())
        tensors_sha, tensors_size = _hash_file(tensors_path)  # hash what reached the file
        _write_file(tmp / STATE_FILE, state_bytes)
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "files": {
                TENSORS_FILE: {"sha256": tensors_sha, "bytes": tensors_size},
                STATE_FILE: {
                    "sha256": hashlib.sha256(state_bytes).hexdigest(),
                    "bytes": len(state_bytes),
                },
            },
            "tensors": {
                key: {"dtype": _DTYPES[t.dtype][0], "shape": list(t.shape)}
                for key, t in prepared.items()
            },
            "created": _dt.datetime.now(_dt.UTC).isoformat(),
        }
        _write_file(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2).encode("ascii"))
        _fsync_dir(tmp)
    except (OSError, SafetensorError) as exc:  # safetensors' own error for a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {path}: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    del prepared

    backup: Path | None = None
    try:
        if path.exists():
            backup = parent / f"{_OLD_PREFIX}{path.name}-{_token()}"
            os.rename(path, backup)
            _fsync_dir(parent)
        os.rename(tmp, path)
        _fsync_dir(parent)
    except OSError as exc:
        if backup is not None and not path.exists():
            with contextlib.suppress(OSError):
                os.rename(backup, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not move checkpoint into place at {path}: {exc}") from exc
    for old in _old_siblings(path):  # the replaced one, and any left by an earlier crash
        with contextlib.suppress(OSError):
            _remove_tree(old)
    return path


# --------------------------------------------------------------------------- verifying


@dataclass(frozen=True)
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class _Verified:
    path: Path
    manifest: dict[str, Any]
    state: dict[str, Any]
    header: dict[str, _Entry]
    prefix: bytes  # the 8-byte length and JSON header of tensors.safetensors, as hashed


def _check_manifest(manifest: Any, path: Path) -> dict[str, Any]:
    if not isinstance(manifest, dict):
        raise _fail(path, f"{MANIFEST_FILE} must hold a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT_NAME:
        raise _fail(
            path, f"{MANIFEST_FILE} format is {manifest.get('format')!r}, expected {FORMAT_NAME!r}"
        )
    version = manifest.get("format_version")
    if not _is_int(version) or version != FORMAT_VERSION:
        raise _fail(
            path,
            f"unsupported format_version {version!r} (this foxhunt reads {FORMAT_VERSION})",
        )
    keys = set(manifest)
    if keys != _MANIFEST_KEYS:
        missing, extra = sorted(_MANIFEST_KEYS - keys), sorted(keys - _MANIFEST_KEYS)
        raise _fail(path, f"{MANIFEST_FILE} keys missing {missing}, unexpected {extra}")
    if not isinstance(manifest["created"], str):
        raise _fail(path, f"{MANIFEST_FILE} 'created' is {manifest['created']!r}, not a string")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise _fail(path, f"{MANIFEST_FILE} 'files' must be an object")
    for name in files:
        if name not in _DATA_FILES:
            raise _fail(path, f"{MANIFEST_FILE} lists unknown file {name!r}")
    for name, info in files.items():
        ok = (
            isinstance(info, dict)
            and set(info) == {"sha256", "bytes"}
            and isinstance(info["sha256"], str)
            and re.fullmatch(r"[0-9a-f]{64}", info["sha256"]) is not None
            and _is_int(info["bytes"])
            and info["bytes"] >= 0
        )
        if not ok:
            raise _fail(path, f"{MANIFEST_FILE} entry for {name!r} is malformed: {info!r}")
    table = manifest["tensors"]
    if not isinstance(table, dict):
        raise _fail(path, f"{MANIFEST_FILE} 'tensors' must be an object")
    for key, spec in table.items():
        ok = (
            isinstance(spec, dict)
            and set(spec) == {"dtype", "shape"}
            and spec["dtype"] in _NAME_TO_DTYPE
            and isinstance(spec["shape"], list)
            and all(_is_int(d) and d >= 0 for d in spec["shape"])
        )
        if not ok:
            raise _fail(path, f"{MANIFEST_FILE} tensor entry {key!r} is malformed: {spec!r}")
    return manifest


def _parse_header(path: Path, file: Path, size: int) -> tuple[dict[str, _Entry], bytes]:
    """Parse and check the safetensors header ourselves: cheap, and errors can name the key."""
    with open(file, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        body = f.read(length) if 2 <= length <= min(_MAX_HEADER_BYTES, size - 8) else b""
    try:
        if not body:
            raise ValueError(f"header length {length} does not fit a {size}-byte file")
        header = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        sniffed = _sniff_pickle(head + body[:64])
        if sniffed is not None:
            raise _fail(
                path,
                f"{TENSORS_FILE} is {sniffed}, not safetensors; refusing it "
                "(foxhunt never unpickles)",
            ) from None
        raise _fail(path, f"{TENSORS_FILE} is not a valid safetensors file ({exc})") from None

    entries: dict[str, _Entry] = {}
    for key, spec in header.items():
        if key == "__metadata__":
            if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
                raise _fail(path, f"{TENSORS_FILE} __metadata__ must map strings to strings")
            continue
        ok = (
            isinstance(spec, dict)
            and set(spec) == {"dtype", "shape", "data_offsets"}
            and spec["dtype"] in _CODE_TO_NAME
            and isinstance(spec["shape"], list)
            and all(_is_int(d) and d >= 0 for d in spec["shape"])
            and isinstance(spec["data_offsets"], list)
            and len(spec["data_offsets"]) == 2
            and all(_is_int(o) for o in spec["data_offsets"])
        )
        if not ok:
            raise _fail(path, f"{TENSORS_FILE} header entry {key!r} is malformed: {spec!r}")
        dtype = _CODE_TO_NAME[spec["dtype"]]
        shape = tuple(spec["shape"])
        begin, end = spec["data_offsets"]
        need = _ITEMSIZE[dtype] * math.prod(shape)
        if end - begin != need:
            raise _fail(
                path,
                f"{TENSORS_FILE} tensor {key!r} spans {end - begin} bytes, "
                f"{_fmt_spec(dtype, shape)} needs {need}",
            )
        entries[key] = _Entry(dtype, shape, begin, end)
    position = 0
    for key, entry in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if entry.begin != position:
            raise _fail(path, f"{TENSORS_FILE} tensor {key!r} data overlaps or leaves a gap")
        position = entry.end
    if position != size - 8 - length:
        raise _fail(
            path,
            f"{TENSORS_FILE} data region is {size - 8 - length} bytes, header describes {position}",
        )
    return entries, head + body


def _verify(path: Path) -> _Verified:
    """Every integrity check; reads and hashes every file but deserialises no tensor."""
    path = Path(path)
    try:
        return _verify_files(path)
    except OSError as exc:
        raise _fail(path, f"could not be read ({exc})") from exc


def _verify_files(path: Path) -> _Verified:
    if not path.exists():
        hint = ""
        if olds := _old_siblings(path):
            hint = f" (an interrupted replace left the previous checkpoint at {olds[-1]})"
        raise CheckpointError(f"checkpoint directory not found: {path}{hint}")
    if not path.is_dir():
        if not path.is_file():
            raise CheckpointError(f"{path} is not a checkpoint directory (nor a regular file)")
        with open(path, "rb") as f:
            head = f.read(64)
        sniffed = _sniff_pickle(head)
        what = f"it is {sniffed}; foxhunt never unpickles" if sniffed else "it is a file"
        raise CheckpointError(f"{path} is not a checkpoint directory: {what}")

    manifest_path = path / MANIFEST_FILE
    if not manifest_path.exists():
        raise _fail(path, f"{MANIFEST_FILE} is missing")
    if not stat.S_ISREG(os.lstat(manifest_path).st_mode):
        raise _fail(path, f"{MANIFEST_FILE} is not a regular file")
    if manifest_path.stat().st_size > _MAX_MANIFEST_BYTES:
        raise _fail(path, f"{MANIFEST_FILE} is larger than {_MAX_MANIFEST_BYTES} bytes")
    manifest = _check_manifest(_parse_json(manifest_path.read_bytes(), path, MANIFEST_FILE), path)

    files: dict[str, dict[str, Any]] = manifest["files"]
    present = {e.name for e in path.iterdir() if not _os_metadata(e.name)} - {MANIFEST_FILE}
    for name in _DATA_FILES:
        if name not in files:
            raise _fail(path, f"{MANIFEST_FILE} does not list {name}")
        if name not in present:
            raise _fail(path, f"{name} is missing")
    if extra := sorted(present - set(files)):
        raise _fail(path, f"unexpected file {extra[0]!r} (not listed in {MANIFEST_FILE})")

    for name in _DATA_FILES:
        file = path / name
        info = os.lstat(file)
        if not stat.S_ISREG(info.st_mode):
            raise _fail(path, f"{name} is not a regular file")
        if info.st_size != files[name]["bytes"]:
            raise _fail(
                path,
                f"{name} has {info.st_size} bytes, manifest says {files[name]['bytes']} "
                "(truncated or modified)",
            )
        sha, _ = _hash_file(file)
        if sha != files[name]["sha256"]:
            raise _fail(path, f"sha256 mismatch for {name} (file modified or corrupted)")

    state = _parse_json((path / STATE_FILE).read_bytes(), path, STATE_FILE)
    if not isinstance(state, dict):
        raise _fail(path, f"{STATE_FILE} must hold a JSON object, got {type(state).__name__}")

    header, prefix = _parse_header(path, path / TENSORS_FILE, files[TENSORS_FILE]["bytes"])
    table: dict[str, dict[str, Any]] = manifest["tensors"]
    if missing := sorted(set(table) - set(header)):
        raise _fail(path, f"tensor {missing[0]!r} is in {MANIFEST_FILE} but not in {TENSORS_FILE}")
    if extra := sorted(set(header) - set(table)):
        raise _fail(path, f"tensor {extra[0]!r} is in {TENSORS_FILE} but not in {MANIFEST_FILE}")
    for key, entry in header.items():
        listed = (table[key]["dtype"], tuple(table[key]["shape"]))
        if listed != (entry.dtype, entry.shape):
            raise _fail(
                path,
                f"tensor {key!r} is {_fmt_spec(entry.dtype, entry.shape)} in {TENSORS_FILE} but "
                f"{_fmt_spec(*listed)} in {MANIFEST_FILE}",
            )
    return _Verified(path, manifest, state, header, prefix)


def _check_expected(
    verified: _Verified,
    expected: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    exact: bool,
) -> None:
    path, header = verified.path, verified.header
    for key, spec in expected.items():
        if not (isinstance(spec, tuple | list) and len(spec) == 2):
            raise TypeError(f"expected[{key!r}] must be (torch.dtype, shape), got {spec!r}")
        dtype, shape = spec
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"expected[{key!r}] dtype must be a torch.dtype, got {dtype!r}")
        want = (_dtype_name(dtype), tuple(int(d) for d in shape))
        if key not in header:
            raise _fail(
                path, f"tensor {key!r} is missing (expected {_fmt_spec(*want)}, found none)"
            )
        entry = header[key]
        if entry.dtype != want[0]:
            raise _fail(path, f"tensor {key!r} has dtype {entry.dtype}, expected {want[0]}")
        if entry.shape != want[1]:
            raise _fail(
                path, f"tensor {key!r} has shape {list(entry.shape)}, expected {list(want[1])}"
            )
    if exact and (extra := sorted(set(header) - set(expected))):
        entry = header[extra[0]]
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise _fail(
            path,
            f"unexpected tensor {extra[0]!r} ({_fmt_spec(entry.dtype, entry.shape)}, "
            f"expected none){more}",
        )


def _load_tensors(verified: _Verified) -> dict[str, torch.Tensor]:
    """Deserialise, then re-hash exactly the returned bytes: what you get is what was verified,
    even if the file changed after the first hash."""
    path, header = verified.path, verified.header
    file = str(path / TENSORS_FILE)
    try:
        if _HAS_PREAD:
            tensors = _st.load_file(file, backend="pread")
        else:  # pragma: no cover - safetensors < 0.6: copy out of the mmap
            tensors = {k: v.clone() for k, v in _st.load_file(file).items()}
    except Exception as exc:  # safetensors raises its own error types
        raise _fail(path, f"{TENSORS_FILE} could not be read ({exc})") from exc
    if set(tensors) != set(header):
        raise _fail(path, f"{TENSORS_FILE} changed while it was being loaded")
    digest = hashlib.sha256(verified.prefix)
    for key, entry in sorted(header.items(), key=lambda kv: kv[1].begin):
        tensor = tensors[key]
        if (_dtype_name(tensor.dtype), tuple(tensor.shape)) != (entry.dtype, entry.shape):
            raise _fail(path, f"{TENSORS_FILE} changed while it was being loaded")
        if tensor.numel():
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
    if digest.hexdigest() != verified.manifest["files"][TENSORS_FILE]["sha256"]:
        raise _fail(path, f"sha256 mismatch for {TENSORS_FILE} (changed while being loaded)")
    return tensors


def verify_checkpoint(path: Path) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is a complete, untampered checkpoint."""
    _verify(Path(path))


def load_checkpoint(
    path: Path,
    *,
    expected: Mapping[str, tuple[torch.dtype, tuple[int, ...]]] | None = None,
    expected_keys_exact: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Verify a checkpoint completely, then return ``(tensors, state)``.

    ``expected`` maps key -> (dtype, shape); a missing key, a wrong dtype or shape, and (when
    ``expected_keys_exact``) an extra key each raise :class:`CheckpointError` naming the key and
    both values. Tensors come back on the CPU, contiguous, in memory owned by torch.
    """
    verified = _verify(Path(path))
    if expected is not None:
        _check_expected(verified, expected, expected_keys_exact)
    return _load_tensors(verified), verified.state


# --------------------------------------------------------------------------- run directory

_STEP_DIR = re.compile(r"^step-(\d{12,})$")
_OLD_STEP_DIR = re.compile(r"^\.old-(step-(\d{12,}))-[0-9a-f]{32}$")
_POINTER = "latest.json"
_POINTER_FORMAT = "foxhunt-latest"


class CheckpointManager:
    """Checkpoints of one run under ``run_dir/checkpoints``: ``step-<12 digits>/`` directories and
    ``latest.json``, a pointer replaced atomically after each complete save.

    Which checkpoint is "latest": the pointer's target when it exists and verifies. Otherwise (no
    pointer, unreadable pointer, target missing or corrupted - e.g. a crash between saving and
    moving the pointer, or a damaged disk) the newest checkpoint by step that verifies, including
    one parked as ``.old-step-*`` by an interrupted replace; a :class:`CheckpointWarning` says so.

    ``keep_last``: after moving the pointer to step S, checkpoints with steps below S are deleted
    except the ``keep_last - 1`` newest. Checkpoints with steps above S (a run resumed from an
    earlier checkpoint) are left alone, never deleted. Stale ``.tmp-*`` entries are removed and
    parked ``.old-*`` checkpoints restored or removed at the start of every save.
    """

    def __init__(self, run_dir: Path, keep_last: int = 3) -> None:
        if not _is_int(keep_last) or keep_last < 1:
            raise ConfigError(f"keep_last must be an integer >= 1, got {keep_last!r}")
        self.run_dir = Path(run_dir)
        self.keep_last = keep_last

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def path_for(self, step: int) -> Path:
        """The directory that holds the checkpoint of ``step``."""
        if not _is_int(step) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        return self.checkpoints_dir / f"step-{step:012d}"

    def blocked(self, steps: Iterable[int]) -> list[tuple[Path, list[str]]]:
        """The checkpoint names of ``steps`` that a save could not replace (a file or link, or
        a directory holding other files, listed): a run saving there would stop at the first."""
        out = []
        for step in sorted(steps):
            path = self.path_for(step)
            if (path.exists() or path.is_symlink()) and not _replaceable(path):
                plain_dir = path.is_dir() and not path.is_symlink()
                out.append((path, foreign_files(path) if plain_dir else []))
        return out

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Final-named checkpoint directories by ascending step (not verified)."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = [
            (int(m.group(1)), entry)
            for entry in self.checkpoints_dir.iterdir()
            if (m := _STEP_DIR.match(entry.name)) and entry.is_dir()
        ]
        return sorted(found)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        with open(self.checkpoints_dir / ".lock", "a+b") as lock:
            if _fcntl is not None:
                _fcntl.flock(lock.fileno(), _fcntl.LOCK_EX)
            try:
                yield
            finally:
                if _fcntl is not None:
                    _fcntl.flock(lock.fileno(), _fcntl.LOCK_UN)

    def _clean(self) -> None:
        """Remove what crashed saves left: temporaries, and old copies whose replace finished."""
        for entry in sorted(self.checkpoints_dir.iterdir()):
            with contextlib.suppress(OSError):  # a failed cleanup must not block the save
                if entry.name.startswith(_TMP_PREFIX):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink()
                elif m := _OLD_STEP_DIR.match(entry.name):
                    final = self.checkpoints_dir / m.group(1)
                    if final.exists():
                        _remove_tree(entry)
                    else:  # the replace died between its renames: put the old checkpoint back
                        os.rename(entry, final)
                        _fsync_dir(self.checkpoints_dir)

    def _write_pointer(self, step: int) -> None:
        target = self.path_for(step).name
        data = json.dumps(
            {"format": _POINTER_FORMAT, "format_version": 1, "checkpoint": target, "step": step}
        ).encode("ascii")
        tmp = self.checkpoints_dir / f"{_TMP_PREFIX}latest-{_token()}.json"
        _write_file(tmp, data)
        os.replace(tmp, self.checkpoints_dir / _POINTER)
        _fsync_dir(self.checkpoints_dir)

    def _prune(self, step: int) -> None:
        older = [(s, p) for s, p in self.checkpoints() if s < step]
        doomed = older[: max(0, len(older) - (self.keep_last - 1))]
        for _, old in doomed:
            _remove_tree(old)

    def save(
        self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any], step: int
    ) -> Path:
        """Save the checkpoint of ``step``, point ``latest.json`` at it, prune; return its path."""
        path = self.path_for(step)
        with self._locked():
            self._clean()
            save_checkpoint(path, tensors, state)
            self._write_pointer(step)
            self._prune(step)
        return path

    def _pointer_target(self) -> tuple[Path | None, str | None]:
        """The pointer's checkpoint directory, or None and why it cannot be used."""
        pointer = self.checkpoints_dir / _POINTER
        if not pointer.is_file():
            return None, f"{pointer} is missing"
        try:
            with open(pointer, "rb") as f:
                data = f.read(4096)
            obj = _parse_json(data, pointer, _POINTER)
        except (OSError, CheckpointError) as exc:
            return None, str(exc)
        ok = (
            isinstance(obj, dict)
            and obj.get("format") == _POINTER_FORMAT
            and obj.get("format_version") == 1
            and isinstance(obj.get("checkpoint"), str)
            and (m := _STEP_DIR.match(obj["checkpoint"])) is not None
            and _is_int(obj.get("step"))
            and int(m.group(1)) == obj["step"]
        )
        if not ok:
            return None, f"{pointer} is malformed: {data[:200]!r}"
        return self.checkpoints_dir / obj["checkpoint"], None

    def _candidates(self) -> Iterator[tuple[Path, str | None]]:
        """Pointer target first, then every other checkpoint newest first, each with the reason
        the previous choice was passed over (None for the pointer target itself)."""
        target, why = self._pointer_target()
        if target is not None:
            yield target, None
        if not self.checkpoints_dir.is_dir():
            return
        found: list[tuple[int, int, Path]] = []
        for entry in self.checkpoints_dir.iterdir():
            if m := _STEP_DIR.match(entry.name):
                found.append((int(m.group(1)), 1, entry))
            elif m := _OLD_STEP_DIR.match(entry.name):
                found.append((int(m.group(2)), 0, entry))
        for _, _, entry in sorted(found, reverse=True):
            if entry != target:
                yield entry, why

    def _first_verified(self) -> _Verified | None:
        failures: list[str] = []
        for candidate, why in self._candidates():
            try:
                verified = _verify(candidate)
            except (CheckpointError, OSError) as exc:
                failures.append(str(exc))
                continue
            if why is not None or failures:
                reasons = "; ".join(([why] if why else []) + failures)
                warnings.warn(
                    f"using checkpoint {candidate} ({reasons})", CheckpointWarning, stacklevel=3
                )
            return verified
        if failures:
            warnings.warn(
                f"no checkpoint in {self.checkpoints_dir} verifies ({'; '.join(failures)})",
                CheckpointWarning,
                stacklevel=3,
            )
        return None

    def latest(self) -> Path | None:
        """The newest usable checkpoint (see the class docstring), or None if there is none."""
        verified = self._first_verified()
        return None if verified is None else verified.path

    def load_latest(
        self,
        expected: Mapping[str, tuple[torch.dtype, tuple[int, ...]]] | None = None,
        *,
        expected_keys_exact: bool = True,
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any], Path]:
        """Load the checkpoint :meth:`latest` picks. A checkpoint that verifies but does not match
        ``expected`` raises: silently resuming from an older one would hide the mismatch."""
        verified = self._first_verified()
        if verified is None:
            raise CheckpointError(f"no usable checkpoint in {self.checkpoints_dir}")
        if expected is not None:
            _check_expected(verified, expected, expected_keys_exact)
        return _load_tensors(verified), verified.state, verified.path
