"""Checkpoint storage: exact round trips, one clear error per kind of damage, no unpickling,
run-directory pointer/pruning/fallback, RNG state round trips and SIGKILL crash safety."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from foxhunt import checkpoint as ck
from foxhunt.checkpoint import (
    FORMAT_VERSION,
    CheckpointManager,
    CheckpointWarning,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from foxhunt.errors import CheckpointError, ConfigError

torch.set_num_threads(1)
SRC = Path(__file__).resolve().parents[1] / "src"


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    return {
        "f32": base,
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
        "f16": torch.randn(2, 3, generator=g).half(),
        "bf16": torch.randn(5, generator=g).bfloat16(),
        "i64": torch.tensor([-(2**62), 0, 2**62 + 7]),
        "i32": torch.arange(-3, 3, dtype=torch.int32).reshape(2, 3),
        "u8": torch.tensor([0, 128, 255], dtype=torch.uint8),
        "bool": torch.tensor([[True, False], [False, True]]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "special": torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-45]),
        "transposed": base.t(),  # non-contiguous view sharing storage with "f32"
        "param": torch.nn.Parameter(torch.ones(2)),
    }


STATE: dict[str, Any] = {
    "step": 12345,
    "config": {"lr": 1e-4, "gamma": 0.99, "name": "rainbow ü ✓", "layers": [64, 64]},
    "big": 2**80,
    "neg_zero": -0.0,
    "nan": float("nan"),
    "inf": float("inf"),
    "none": None,
    "flag": True,
    "nested": [{"a": [1, 2.5, "x"]}, []],
}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy()) == bytes(
        b.contiguous().reshape(-1).view(torch.uint8).numpy()
    )


def _rehash(path: Path) -> None:
    """Make the manifest's hashes agree with the files again (to reach the later checks)."""
    manifest = json.loads((path / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (path / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "manifest.json").write_text(json.dumps(manifest))


def _edit_manifest(path: Path, **changes: Any) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _flip(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", _tensors(), STATE)


# --------------------------------------------------------------------------- round trip


def test_round_trip_is_bitwise_and_leaves_no_temporaries(tmp_path: Path, saved: Path) -> None:
    original = _tensors()
    tensors, state = load_checkpoint(saved)
    assert set(tensors) == set(original)
    for key, tensor in original.items():
        assert _same_bits(tensors[key], tensor.detach()), key
        assert tensors[key].is_contiguous()
        assert not tensors[key].requires_grad
    assert json.dumps(state) == json.dumps(STATE)  # NaN-safe exact comparison
    assert math.copysign(1.0, state["neg_zero"]) == -1.0
    assert state["big"] == 2**80
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in saved.iterdir()) == [
        "manifest.json",
        "state.json",
        "tensors.safetensors",
    ]


def test_manifest_matches_an_independent_hash_and_table(saved: Path) -> None:
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["format"] == "foxhunt-checkpoint"
    assert manifest["format_version"] == FORMAT_VERSION == 1
    for name in ("tensors.safetensors", "state.json"):
        data = (saved / name).read_bytes()
        assert manifest["files"][name] == {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
    assert manifest["tensors"]["bf16"] == {"dtype": "bfloat16", "shape": [5]}
    assert manifest["tensors"]["transposed"] == {"dtype": "float32", "shape": [6, 4]}
    assert manifest["tensors"]["scalar"] == {"dtype": "float32", "shape": []}
    assert manifest["tensors"]["bool"] == {"dtype": "bool", "shape": [2, 2]}


def test_loaded_tensors_are_owned_and_writable(saved: Path) -> None:
    tensors, _ = load_checkpoint(saved)
    before = tensors["f32"].clone()
    file = saved / "tensors.safetensors"
    file.write_bytes(b"\0" * file.stat().st_size)
    assert torch.equal(tensors["f32"], before)  # not an mmap of the file
    tensors["f32"].add_(1.0)
    assert torch.equal(tensors["f32"], before + 1.0)


def test_fallback_loader_without_pread(monkeypatch: pytest.MonkeyPatch, saved: Path) -> None:
    monkeypatch.setattr(ck, "_HAS_PREAD", False)
    tensors, _ = load_checkpoint(saved)
    assert _same_bits(tensors["bf16"], _tensors()["bf16"])


def test_file_changed_between_verify_and_load_is_refused(saved: Path) -> None:
    verified = ck._verify(saved)
    file = saved / "tensors.safetensors"
    _flip(file, file.stat().st_size - 3)
    with pytest.raises(CheckpointError, match="changed while being loaded"):
        ck._load_tensors(verified)


def test_replace_swaps_atomically_and_cleans_up(tmp_path: Path, saved: Path) -> None:
    save_checkpoint(saved, {"x": torch.zeros(1)}, {"v": 2})
    tensors, state = load_checkpoint(saved)
    assert state == {"v": 2} and list(tensors) == ["x"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_refuses_to_overwrite_something_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    with pytest.raises(CheckpointError, match="not a foxhunt checkpoint"):
        save_checkpoint(target, {}, {})
    assert (target / "notes.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


@pytest.mark.parametrize(
    ("state", "error", "pattern"),
    [
        ({"shape": (1, 2)}, TypeError, r"state\['shape'\] is a tuple"),
        ({"by_step": {3: 1.0}}, TypeError, r"key 3 of type int"),
        ({"n": np.int64(3)}, TypeError, r"state\['n'\] is a int64"),
        ({"t": torch.zeros(1)}, TypeError, r"state\['t'\] is a Tensor"),
    ],
)
def test_state_that_json_would_change_is_refused(
    tmp_path: Path, state: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        save_checkpoint(tmp_path / "c", {}, state)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", [".tmp-x", ".old-x"])
def test_reserved_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(CheckpointError, match="reserved"):
        save_checkpoint(tmp_path / name, {}, {})


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int16, torch.int8])
def test_unsupported_dtype_is_refused(tmp_path: Path, dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=r"tensors\['x'\] has dtype"):
        save_checkpoint(tmp_path / "c", {"x": torch.zeros(2, dtype=dtype)}, {})


# --------------------------------------------------------------------------- corruption


def _truncate(p: Path) -> None:
    f = p / "tensors.safetensors"
    f.write_bytes(f.read_bytes()[:-10])


def _flip_data(p: Path) -> None:
    f = p / "tensors.safetensors"
    _flip(f, f.stat().st_size - 5)


def _flip_header(p: Path) -> None:
    _flip(p / "tensors.safetensors", 20)


def _bad_state_json(p: Path) -> None:
    (p / "state.json").write_text('{"step": 1,')
    _rehash(p)


def _state_not_object(p: Path) -> None:
    (p / "state.json").write_text("[1, 2]")
    _rehash(p)


def _header_disagrees(p: Path) -> None:
    manifest = json.loads((p / "manifest.json").read_text())
    manifest["tensors"]["f32"]["shape"] = [6, 4]
    (p / "manifest.json").write_text(json.dumps(manifest))


def _duplicate_key(p: Path) -> None:
    text = (p / "manifest.json").read_text()
    (p / "manifest.json").write_text(text.replace('"format": ', '"format": "x", "format": ', 1))


CORRUPTIONS = {
    "truncated": (_truncate, r"tensors.safetensors has \d+ bytes, manifest says \d+"),
    "flipped data byte": (_flip_data, r"sha256 mismatch for tensors.safetensors"),
    "flipped header byte": (_flip_header, r"sha256 mismatch for tensors.safetensors"),
    "flipped state byte": (
        lambda p: _flip(p / "state.json", 3),
        r"sha256 mismatch for state.json",
    ),
    "missing file": (lambda p: (p / "state.json").unlink(), r"state.json is missing"),
    "extra file": (
        lambda p: (p / "extra.txt").write_text("hi"),
        r"unexpected file 'extra.txt'",
    ),
    "manifest missing": (lambda p: (p / "manifest.json").unlink(), r"manifest.json is missing"),
    "manifest bad json": (
        lambda p: (p / "manifest.json").write_text("{not json"),
        r"manifest.json is not valid JSON",
    ),
    "manifest duplicate key": (_duplicate_key, r"manifest.json is not valid JSON.*duplicate key"),
    "state bad json": (_bad_state_json, r"state.json is not valid JSON"),
    "state not an object": (_state_not_object, r"state.json must hold a JSON object, got list"),
    "unknown version": (
        lambda p: _edit_manifest(p, format_version=7),
        r"unsupported format_version 7 \(this foxhunt reads 1\)",
    ),
    "foreign format": (
        lambda p: _edit_manifest(p, format="other"),
        r"format is 'other', expected 'foxhunt-checkpoint'",
    ),
    "manifest lists unknown file": (
        lambda p: _edit_manifest(p, files={"../x": {"sha256": "0" * 64, "bytes": 0}}),
        r"lists unknown file '../x'",
    ),
    "header vs manifest": (
        _header_disagrees,
        r"tensor 'f32' is float32\[4, 6\] in tensors.safetensors but float32\[6, 4\] in manifest",
    ),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_each_corruption_has_its_own_clear_error(saved: Path, kind: str) -> None:
    damage, pattern = CORRUPTIONS[kind]
    verify_checkpoint(saved)  # intact before
    damage(saved)
    with pytest.raises(CheckpointError, match=pattern) as info:
        load_checkpoint(saved)
    message = str(info.value)
    assert "\n" not in message and str(saved) in message


def test_missing_directory_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=re.escape(f"not found: {tmp_path / 'nope'}")):
        load_checkpoint(tmp_path / "nope")


def test_interrupted_replace_names_the_parked_checkpoint(saved: Path) -> None:
    parked = saved.with_name(f".old-{saved.name}-{'a' * 32}")
    os.rename(saved, parked)  # what a crash between the two renames leaves
    with pytest.raises(CheckpointError, match=re.escape(f"previous checkpoint at {parked}")):
        load_checkpoint(saved)
    load_checkpoint(parked)  # and it is complete


_EXPECTED = {k: (t.dtype, tuple(t.shape)) for k, t in _tensors().items()}


@pytest.mark.parametrize(
    ("change", "exact", "pattern"),
    [
        (
            {"f32": (torch.float32, (4, 7))},
            True,
            r"tensor 'f32' has shape \[4, 6\], expected \[4, 7\]",
        ),
        ({"i64": (torch.int32, (3,))}, True, r"tensor 'i64' has dtype int64, expected int32"),
        (
            {"extra_key": (torch.float32, (1,))},
            True,
            r"tensor 'extra_key' is missing \(expected float32\[1\], found none\)",
        ),
        ({"u8": None}, True, r"unexpected tensor 'u8' \(uint8\[3\], expected none\)"),
        (
            {"u8": None, "ghost": (torch.bool, ())},
            False,
            r"tensor 'ghost' is missing \(expected bool\[\], found none\)",
        ),
    ],
)
def test_expected_mismatch_names_key_and_both_values(
    saved: Path, change: dict[str, Any], exact: bool, pattern: str
) -> None:
    expected = dict(_EXPECTED)
    for key, spec in change.items():
        if spec is None:
            del expected[key]
        else:
            expected[key] = spec
    with pytest.raises(CheckpointError, match=pattern):
        load_checkpoint(saved, expected=expected, expected_keys_exact=exact)


def test_expected_match_and_non_exact_extra_keys_pass(saved: Path) -> None:
    load_checkpoint(saved, expected=_EXPECTED)
    subset = {"f32": (torch.float32, (4, 6))}
    tensors, _ = load_checkpoint(saved, expected=subset, expected_keys_exact=False)
    assert set(tensors) == set(_EXPECTED)


# --------------------------------------------------------------------------- never unpickle


class _Evil:
    """Unpickling this creates ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def _payload(kind: str, marker: Path, file: Path) -> None:
    if kind == "pickle":
        file.write_bytes(pickle.dumps(_Evil(marker), protocol=4))
    else:
        torch.save({"w": _Evil(marker)}, file)


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_payload_is_live(tmp_path: Path, kind: str) -> None:
    """Control: the payloads really do execute code when unpickled."""
    marker, file = tmp_path / "marker", tmp_path / "payload"
    _payload(kind, marker, file)
    if kind == "pickle":
        pickle.loads(file.read_bytes())
    else:
        torch.load(file, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_pickle_as_the_path_is_refused_without_executing(tmp_path: Path, kind: str) -> None:
    marker, file = tmp_path / "marker", tmp_path / "model.pt"
    _payload(kind, marker, file)
    with pytest.raises(CheckpointError, match=r"not a checkpoint directory.*never unpickles"):
        load_checkpoint(file)
    with pytest.raises(CheckpointError, match="never unpickles"):
        verify_checkpoint(file)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
@pytest.mark.parametrize("rehash", [True, False])
def test_pickle_inside_a_checkpoint_is_refused_without_executing(
    tmp_path: Path, saved: Path, kind: str, rehash: bool
) -> None:
    marker = tmp_path / "marker"
    _payload(kind, marker, saved / "tensors.safetensors")
    if rehash:  # a forger who also fixed the manifest's hash still gets nowhere
        _rehash(saved)
        pattern = r"tensors.safetensors is a .*(pickle|zip).*never unpickles"
    else:
        pattern = r"tensors.safetensors has \d+ bytes|sha256 mismatch"
    with pytest.raises(CheckpointError, match=pattern):
        load_checkpoint(saved)
    assert not marker.exists()


# --------------------------------------------------------------------------- run directory


def _step_tensors(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3, 2), float(step)), "step": torch.tensor([step])}


def test_manager_keeps_last_and_points_at_newest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (10, 20, 30, 40, 50):
        path = manager.save(_step_tensors(step), {"step": step}, step)
        assert path == tmp_path / "checkpoints" / f"step-{step:012d}"
    assert [s for s, _ in manager.checkpoints()] == [40, 50]
    pointer = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert pointer["checkpoint"] == "step-000000000050" and pointer["step"] == 50
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        tensors, state, path = manager.load_latest()
    assert state == {"step": 50} and torch.equal(tensors["w"], torch.full((3, 2), 50.0))
    assert path == manager.latest() == tmp_path / "checkpoints" / "step-000000000050"


def test_a_save_puts_back_an_old_copy_whose_replace_died_between_its_renames(
    tmp_path: Path,
) -> None:
    """A crash between a replace's two renames leaves the only copy as .old-step-N-<token>:
    the next save restores it, and never deletes it."""
    manager = CheckpointManager(tmp_path, keep_last=5)
    manager.save(_step_tensors(10), {"step": 10}, 10)
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step-000000000010").rename(ckpts / f".old-step-000000000010-{'ab' * 16}")
    manager.save(_step_tensors(20), {"step": 20}, 20)
    assert sorted(p.name for p in ckpts.iterdir() if not p.name.startswith((".lock",))) == [
        "latest.json", "step-000000000010", "step-000000000020"
    ]  # fmt: skip
    assert [s for s, _ in manager.checkpoints()] == [10, 20]


def test_a_failed_atomic_write_leaves_no_temporary_and_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from foxhunt import _io

    target = tmp_path / "summary.json"
    target.write_text("old")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device", str(src))

    monkeypatch.setattr(_io.os, "replace", refuse)
    with pytest.raises(OSError):
        _io.atomic_write_text(target, "new")
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    assert target.read_text() == "old"


def test_manager_never_prunes_latest_nor_newer_steps(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    for step in (5, 6, 7):
        manager.save(_step_tensors(step), {"step": step}, step)
    manager.save(_step_tensors(3), {"step": 3}, 3)  # resumed from an earlier point
    assert [s for s, _ in manager.checkpoints()] == [3, 7]
    assert manager.load_latest()[1] == {"step": 3}


@pytest.mark.parametrize("keep_last", [0, -1, 1.5, True])
def test_keep_last_must_be_positive_int(tmp_path: Path, keep_last: Any) -> None:
    with pytest.raises(ConfigError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=keep_last)


def test_latest_falls_back_when_newest_is_corrupted(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2, 3):
        manager.save(_step_tensors(step), {"step": step}, step)
    _flip_data(manager.path_for(3))
    with pytest.warns(CheckpointWarning, match="sha256 mismatch"):
        assert manager.latest() == manager.path_for(2)
    with pytest.warns(CheckpointWarning):
        tensors, state, path = manager.load_latest()
    assert state == {"step": 2} and int(tensors["step"]) == 2 and path == manager.path_for(2)


@pytest.mark.parametrize("pointer", [None, "{garbage", '{"format": "foxhunt-latest"}'])
def test_latest_falls_back_without_a_usable_pointer(tmp_path: Path, pointer: str | None) -> None:
    manager = CheckpointManager(tmp_path)
    for step in (1, 2):
        manager.save(_step_tensors(step), {"step": step}, step)
    file = tmp_path / "checkpoints" / "latest.json"
    if pointer is None:
        file.unlink()
    else:
        file.write_text(pointer)
    with pytest.warns(CheckpointWarning, match="latest.json"):
        assert manager.latest() == manager.path_for(2)


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    assert manager.latest() is None
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        manager.load_latest()


def test_expected_mismatch_on_latest_raises_instead_of_falling_back(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(_step_tensors(1), {"step": 1}, 1)
    manager.save({"w": torch.zeros(9)}, {"step": 2}, 2)
    expected = {"w": (torch.float32, (3, 2)), "step": (torch.int64, (1,))}
    with pytest.raises(CheckpointError, match=r"has shape \[9\], expected \[3, 2\]"):
        manager.load_latest(expected)


def test_stale_temporaries_are_ignored_then_cleaned(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(_step_tensors(1), {"step": 1}, 1)
    root = tmp_path / "checkpoints"
    stale = root / f".tmp-step-000000000002-{'b' * 32}"
    stale.mkdir()
    (stale / "tensors.safetensors").write_bytes(b"partial")
    (root / ".tmp-latest-dead.json").write_text('{"checkpoint": "step-000000000002"}')
    assert manager.latest() == manager.path_for(1)
    assert stale.exists()  # reading never deletes; only a save cleans up
    manager.save(_step_tensors(2), {"step": 2}, 2)
    assert sorted(p.name for p in root.iterdir()) == [
        ".lock",
        "latest.json",
        "step-000000000001",
        "step-000000000002",
    ]


def test_checkpoint_parked_by_interrupted_replace_is_found_then_restored(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(_step_tensors(7), {"step": 7}, 7)
    final = manager.path_for(7)
    parked = final.with_name(f".old-{final.name}-{'c' * 32}")
    os.rename(final, parked)  # crash between "old away" and "new in" while re-saving step 7
    with pytest.warns(CheckpointWarning):
        assert manager.latest() == parked
    manager.save(_step_tensors(8), {"step": 8}, 8)
    assert not parked.exists()
    assert [s for s, _ in manager.checkpoints()] == [8]  # 7 restored, then pruned by keep_last


# --------------------------------------------------------------------------- crash safety

_CHILD = """
import sys, torch
from pathlib import Path
from foxhunt.checkpoint import CheckpointManager
from foxhunt.errors import CheckpointError
torch.set_num_threads(1)
manager = CheckpointManager(Path(sys.argv[1]), keep_last=2)
try:
    step = manager.load_latest()[1]["step"] + 1
except CheckpointError:
    step = 0
print("ready", flush=True)
while True:
    w = torch.full((128, 256), float(step))
    manager.save({"w": w, "step": torch.tensor([step])}, {"step": step, "pad": "x" * (step % 7)},
                 step)
    step += 1
"""


def _pointer_step(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"]
    except FileNotFoundError:
        return -1


def test_sigkill_during_saves_always_leaves_a_consistent_latest(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    manager = CheckpointManager(tmp_path, keep_last=2)
    previous = -1
    for _ in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            deadline = time.monotonic() + 20
            while _pointer_step(tmp_path) <= previous:  # the child has saved at least once
                assert time.monotonic() < deadline, "child never saved"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.02, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()  # type: ignore[union-attr]

        with warnings.catch_warnings():
            warnings.simplefilter("error", CheckpointWarning)  # the pointer is always usable
            tensors, state, path = manager.load_latest()
        step = state["step"]
        assert path == manager.path_for(step)
        assert int(tensors["step"]) == step
        assert torch.equal(tensors["w"], torch.full((128, 256), float(step)))
        assert step > previous  # each child resumed and saved at least once more
        previous = step
        for _, final in manager.checkpoints():  # no partial directory has a final name
            verify_checkpoint(final)


def test_atomic_writes_get_the_mode_a_plain_open_would(tmp_path: Path) -> None:
    """mkstemp's 0600 is not kept: run files are as readable as the user's umask allows."""
    import os

    from foxhunt._io import _FILE_MODE, atomic_write_text

    atomic_write_text(tmp_path / "a.json", "{}")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    mode = (tmp_path / "a.json").stat().st_mode & 0o777
    assert mode == plain.stat().st_mode & 0o777 == _FILE_MODE
    # a checkpoint's tensors too (safetensors creates its file 0600)
    ckpt = save_checkpoint(tmp_path / "step-1", _step_tensors(1), {"step": 1})
    assert {p.name: p.stat().st_mode & 0o777 for p in ckpt.iterdir()} == dict.fromkeys(
        ("tensors.safetensors", "state.json", "manifest.json"), _FILE_MODE
    )
    assert not list(tmp_path.glob(".*.tmp")) and os.access(tmp_path / "a.json", os.R_OK)


def test_a_failed_atomic_write_names_the_file_asked_for(tmp_path: Path, monkeypatch) -> None:
    """The temp file's name (.x.csv.30er06a2.tmp) is one the user never gave."""
    import errno
    import tempfile

    from foxhunt._io import atomic_write_text

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".x.csv.abc.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(OSError) as err:
        atomic_write_text(tmp_path / "x.csv", "data")
    assert err.value.filename == str(tmp_path / "x.csv") and err.value.errno == errno.ENOSPC


@pytest.mark.parametrize(("total", "saves"), [(600, [300, 600]), (700, [300, 600, 700])])
def test_the_end_of_a_run_is_not_saved_twice(total: int, saves: list[int]) -> None:
    """A periodic checkpoint at the last step (checkpoint_interval dividing the total) already
    holds the final state: saving it again doubled the I/O, and replacing a checkpoint needs
    room for two, so a disk the run fit on all along failed it at its last step."""
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    class Recorder:
        def __init__(self) -> None:
            self.steps: list[int] = []

        def save(self, trainer: DQNTrainer) -> Path:
            self.steps.append(trainer.env_steps)
            return Path("unused")

    hp = DQNHyperparameters(
        hidden_sizes=(8,), learning_starts=100, checkpoint_interval=300, eval_interval=0
    )
    trainer = DQNTrainer(hp, "CartPole-v1")
    try:
        trainer._checkpointer = first = Recorder()
        trainer.learn(total)
        assert first.steps == saves
        trainer._checkpointer = second = Recorder()  # another destination: it gets the state
        trainer.learn(total)
        assert second.steps == [saves[-1]]
    finally:
        trainer.close()


def test_a_full_disk_inside_safetensors_names_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors raises its own error for ENOSPC; the CLI could only say "No space left on
    device (writing a checkpoint)", without the path. It is a CheckpointError naming it now."""
    from safetensors import SafetensorError

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
            'space left on device" })'
        )

    monkeypatch.setattr(ck._st, "save_file", full)
    target = tmp_path / "step-000000000010"
    with pytest.raises(CheckpointError, match=r"could not write checkpoint .*step-000000000010: "):
        save_checkpoint(target, _step_tensors(10), {"step": 10})
    assert list(tmp_path.iterdir()) == []  # the partial directory is gone


class _StepRecorder:
    """A checkpointer that records the env step of each save instead of writing it."""

    def __init__(self) -> None:
        self.saves: list[int] = []

    def save(self, trainer: Any) -> Path:
        self.saves.append(trainer.env_steps)
        return Path(f"step-{trainer.env_steps}")


def test_an_interrupt_at_a_checkpoints_step_does_not_save_it_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Ctrl-C honoured at the step a periodic checkpoint was just written: that checkpoint is
    the one the interrupt names, not a second copy of it."""
    import signal

    from foxhunt.config import DQNHyperparameters
    from foxhunt.errors import TrainingInterrupted
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters(
        hidden_sizes=(8,), learning_starts=100, checkpoint_interval=300, eval_interval=0,
        log_interval=100,
    )  # fmt: skip
    trainer = DQNTrainer(hp, "CartPole-v1")
    recorder = _StepRecorder()

    def ctrl_c_at_300(row: dict) -> None:
        if row["env_steps"] == 300:
            trainer._interrupt_requested = signal.SIGINT

    try:
        trainer._checkpointer = recorder
        with pytest.raises(TrainingInterrupted) as err:
            trainer.learn(600, callback=ctrl_c_at_300)
        assert recorder.saves == [300] and err.value.checkpoint == Path("step-300")
        assert "interrupted at env step 300: its checkpoint was just written" in caplog.text
    finally:
        trainer.close()


@pytest.mark.parametrize(
    ("signals", "repeat_s", "stops_with_a_checkpoint"),
    [
        # kill of a torchrun job's pids: each worker gets SIGTERM from kill and again from
        # torchrun a millisecond later; the second was taken for "stop at once, no checkpoint".
        (("SIGTERM", "SIGTERM"), 1.0, True),
        (("SIGTERM", "SIGTERM"), 0.0, False),  # a second SIGTERM later: a second ask
        (("SIGINT", "SIGINT"), 1.0, False),  # a double Ctrl-C still forces the stop
        (("SIGTERM", "SIGINT"), 1.0, False),
    ],
)
def test_one_sigterm_delivered_twice_is_one_stop_request(
    monkeypatch: pytest.MonkeyPatch,
    signals: tuple[str, str],
    repeat_s: float,
    stops_with_a_checkpoint: bool,
) -> None:
    import os
    import signal

    from foxhunt.config import DQNHyperparameters
    from foxhunt.errors import TrainingInterrupted
    from foxhunt.trainer import DQNTrainer

    monkeypatch.setattr(DQNTrainer, "_REPEAT_S", repeat_s)
    hp = DQNHyperparameters(
        hidden_sizes=(8,), learning_starts=100, eval_interval=0, log_interval=100
    )
    trainer = DQNTrainer(hp, "CartPole-v1")
    recorder = _StepRecorder()

    def signal_at_300(row: dict) -> None:
        if row["env_steps"] == 300:
            for name in signals:
                os.kill(os.getpid(), getattr(signal, name))

    trainer._checkpointer = recorder
    try:
        with pytest.raises(KeyboardInterrupt) as err:
            trainer.learn(600, callback=signal_at_300)
        if stops_with_a_checkpoint:
            assert isinstance(err.value, TrainingInterrupted) and recorder.saves == [300]
            assert err.value.checkpoint == Path("step-300")
        else:
            assert not isinstance(err.value, TrainingInterrupted) and recorder.saves == []
    finally:
        trainer.close()
