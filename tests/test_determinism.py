"""Determinism on CPU: the same seed gives the same metrics file and weights; another seed does not.

Each run is its own ``foxhunt train`` process (so a different hash seed, fresh imports and fresh
global RNGs), with epsilon-greedy exploration, uniform replay and greedy evaluations - the parts a
determinism bug would most likely touch that the resume tests (noisy nets, PER) do not.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import torch
from _helpers import TINY_CARTPOLE
from safetensors.torch import load_file

from foxhunt.logging import METRIC_COLUMNS, WALL_CLOCK_COLUMNS

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = {
    **TINY_CARTPOLE,
    "eval_interval": 500,
    "eval_episodes": 2,
    "exploration_fraction": 0.5,
    "torch_threads": 1,
    "device": "cpu",
}


def start(run_dir: Path, seed: int) -> subprocess.Popen[str]:
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    # PYTHONHASHSEED is left random on purpose: set iteration order must not leak into results.
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "foxhunt.cli",
            "train",
            "--env",
            "CartPole-v1",
            "--total-steps",
            "1500",
            "--seed",
            str(seed),
            "--run-dir",
            str(run_dir),
            "--no-progress",
            *sets,
        ],
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == list(METRIC_COLUMNS)
        return [{k: v for k, v in r.items() if k not in WALL_CLOCK_COLUMNS} for r in reader]


def test_same_seed_same_run_different_seed_different_run(tmp_path: Path) -> None:
    runs = {name: tmp_path / name for name in ("a", "b", "c")}
    procs = {
        name: start(path, seed) for (name, path), seed in zip(runs.items(), (3, 3, 4), strict=True)
    }
    for name, proc in procs.items():  # concurrently: they must not interfere either
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, err)

    ma, mb, mc = (metrics(p) for p in runs.values())
    assert len(ma) == 15
    assert ma == mb
    assert any(r["eval_return"] for r in ma) and all(r["loss"] for r in ma[2:])
    wa, wb, wc = (load_file(str(p / "model.safetensors")) for p in runs.values())
    assert wa.keys() == wb.keys() == wc.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    # Another seed: different episodes, losses and weights from the first rows on.
    assert ma != mc
    assert [r["episode_return"] for r in ma] != [r["episode_return"] for r in mc]
    assert [r["loss"] for r in ma] != [r["loss"] for r in mc]
    assert not any(torch.equal(wa[k], wc[k]) for k in wa if wa[k].numel() > 1)
