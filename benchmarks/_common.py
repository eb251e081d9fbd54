"""Shared plumbing for the side-by-side benchmarks: machine description, timing, JSON output.

Every benchmark reports RATIOS measured in one process against a peer, with repetitions interleaved
(A, B, A, B, ...) so that load from other users of a shared machine hits both sides alike; medians
then discard the odd slow repetition.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"


def ensure_foxhunt_importable() -> None:
    """Let ``python benchmarks/x.py`` run from a checkout where foxhunt is not pip-installed."""
    try:
        import foxhunt  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO_ROOT / "src"))


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, with family/model numbers when the name is vague."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model") and key not in fields:
                fields[key] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge the numbers: CPU, cores, load, library versions, threads."""
    import gymnasium
    import numpy
    import torch

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
        "gymnasium": gymnasium.__version__,
        "cuda": torch.cuda.is_available(),
    }
    with contextlib.suppress(OSError):
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    try:
        import stable_baselines3

        info["stable_baselines3"] = stable_baselines3.__version__
    except ImportError:
        info["stable_baselines3"] = None
    return info


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def interleaved(contenders: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Run each contender once per repetition, in turn, rotating the starting one.

    Each callable returns the figure of one repetition (e.g. updates/s). Rotating the order stops a
    systematic first/second position effect (cache state, turbo) from favouring one side.
    """
    names = list(contenders)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(float(contenders[name]()))
    return out


def per_rep_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Ratios of paired repetitions (rep i of A over rep i of B)."""
    return [a / b for a, b in zip(num, den, strict=True)]


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--smoke", action="store_true", help="tiny run (seconds)")
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    return p


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    """Write JSON atomically: temp file in the same directory, fsync, os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def finish(
    name: str,
    args: argparse.Namespace,
    config: dict[str, Any],
    results: list[dict[str, Any]],
    ratios: dict[str, float],
    notes: str,
    table: str,
) -> dict[str, Any]:
    """Assemble the common JSON layout, write it, print the markdown table; returns the payload."""
    payload = {
        "benchmark": name,
        # As run: the flags given (an opt-in env, the configurations, the jobs) reproduce it.
        "command": " ".join(["python", f"benchmarks/{name}.py", *sys.argv[1:]])
        if Path(sys.argv[0]).stem == name
        else f"python benchmarks/{name}.py" + (" --smoke" if args.smoke else ""),
        "smoke": bool(args.smoke),
        "machine": machine_info(),
        "config": config,
        "results": results,
        "ratios": ratios,
        "notes": notes,
    }
    out = (
        args.out
        if args.out is not None
        else RESULTS_DIR / (f"{name}.smoke.json" if args.smoke else f"{name}.json")
    )
    write_json(out, payload)
    print(table)
    print(f"\nwrote {out}")
    return payload


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A small GitHub-markdown table (floats to 3 significant digits)."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fill_sb3_replay(rb: Any, data: dict[str, Any]) -> None:
    """Put the benchmark's transitions into an SB3 ``ReplayBuffer`` (one env), full."""
    rb.observations[:, 0] = data["obs"]
    rb.next_observations[:, 0] = data["next_obs"]
    rb.actions[:, 0, 0] = data["actions"]
    rb.rewards[:, 0] = data["rewards"]
    rb.dones[:, 0] = data["dones"]
    rb.timeouts[:] = 0.0
    rb.pos, rb.full = 0, True
