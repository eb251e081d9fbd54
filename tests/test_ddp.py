"""Data-parallel training equals one process over all ranks' samples (gloo, 2 CPU processes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = textwrap.dedent(
    """
    import os, sys, torch, gymnasium as gym
    import torch.distributed as dist
    from safetensors.torch import save_file
    torch.set_num_threads(1)
    from foxhunt import DQNAgent, DQNHyperparameters, Batch
    from foxhunt.distributed import init_from_env
    from tests.test_ddp import make_batch, HP
    info = init_from_env("cpu")
    hp = DQNHyperparameters(**HP, compile=sys.argv[2] == "1")
    obs_space = gym.spaces.Box(-1e9, 1e9, (6,))
    agent = DQNAgent(obs_space, gym.spaces.Discrete(3), hp)
    agent.enable_data_parallel()
    full = make_batch(128)
    mine = full.slice(64 * info.rank, 64 * (info.rank + 1))
    micro = mine.split([32, 32])
    for i, mb in enumerate(micro):
        agent.backward_micro_batch(mb, len(mb) / 64, sync=i == len(micro) - 1)
    stats = agent.optimizer_step()
    save_file({k: v.contiguous() for k, v in agent.online_net.state_dict().items()},
              os.path.join(sys.argv[1], f"rank{info.rank}.safetensors"))
    dist.barrier()  # both ranks are done with collectives before either tears down
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: gloo threads can abort it (std::terminate)
    """
)

HP = dict(
    hidden_sizes=(16, 16),
    optimizer="sgd",
    learning_rate=0.1,
    max_grad_norm=0.05,
    batch_size=32,
    gradient_accumulation_steps=2,
    learning_starts=64,
    dueling=True,
    noisy_nets=True,
    distributional="c51",
    n_atoms=11,
    seed=3,
)


def make_batch(n: int):
    """A deterministic batch with PER-like weights, n-step discounts and terminations."""
    from foxhunt import Batch

    g = torch.Generator().manual_seed(11)
    return Batch(
        obs=torch.randn(n, 6, generator=g),
        actions=torch.randint(0, 3, (n,), generator=g),
        rewards=torch.randn(n, generator=g),
        next_obs=torch.randn(n, 6, generator=g),
        dones=(torch.rand(n, generator=g) < 0.2).float(),
        discounts=0.99 ** torch.randint(1, 4, (n,), generator=g).float(),
        weights=torch.rand(n, generator=g) * 0.5 + 0.5,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_ranks(
    tmp_path: Path, script: str, arg: str, env: dict[str, str] | None = None
) -> list[tuple[int, str]]:
    """Run ``script`` (with ``tmp_path`` and ``arg``) as ranks 0 and 1 of a gloo job, as
    torchrun would start them; each rank's exit code and stderr."""
    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "rank_script.py"
    path.write_text(script)
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(path), str(tmp_path), arg],
            env={
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONPATH": f"{root}{os.pathsep}{root / 'src'}",
                **(env or {}),
            },
            cwd=root,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    out = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        out.append((p.returncode, err))
    return out


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_ddp_two_ranks_equal_single_process_step(tmp_path: Path, compiled: bool) -> None:
    """Each rank accumulates 2 x 32 of its half under no_sync/sync (compiled: the objective
    traced through the DDP wrapper); the result equals one eager process over all 128."""
    import gymnasium as gym

    from foxhunt import DQNAgent, DQNHyperparameters

    for code, err in _two_ranks(tmp_path, WORKER, str(int(compiled))):
        assert code == 0, err[-2000:]

    # Reference: one process, the same 128 samples as 4 micro-batches of 32.
    torch.set_num_threads(1)
    hp = DQNHyperparameters(**HP)
    agent = DQNAgent(gym.spaces.Box(-1e9, 1e9, (6,)), gym.spaces.Discrete(3), hp)
    full = make_batch(128)
    for mb in full.split([32, 32, 32, 32]):
        agent.backward_micro_batch(mb, len(mb) / 128)
    stats = agent.optimizer_step()
    assert stats.clipped  # the comparison covers clipping too
    ref = agent.online_net.state_dict()
    for rank in range(2):
        got = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        for k, v in ref.items():
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {k}")


def test_torchrun_cli_trains_with_per_and_accumulation(tmp_path: Path) -> None:
    """`torchrun -m foxhunt train`, as the README writes it: two ranks, PER (max weight
    all-reduced), rank 0 writes."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        "-m",
        "foxhunt",
        "train",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "800",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--set",
        "learning_starts=200",
        "--set",
        "hidden_sizes=[16]",
        "--set",
        "prioritized_replay=true",
        "--set",
        "batch_size=16",
        "--set",
        "gradient_accumulation_steps=2",
        "--set",
        "eval_interval=0",
        "--set",
        "log_interval=200",
    ]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = (run_dir / "summary.json").read_text()
    assert '"env_steps": 800' in summary and '"world_size": 2' in summary  # counts per process
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 4  # header + one row per 200 env steps, written once (rank 0)
    # resume continues in one process: refused under torchrun, said when run alone.
    resume = [*cmd[: cmd.index("train")], "resume", str(run_dir), "--total-steps", "1000"]
    proc = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "resume continues a run in one process" in proc.stderr
    alone = [sys.executable, "-m", "foxhunt.cli", "resume", str(run_dir), "--total-steps", "1000"]
    proc = subprocess.run([*alone, "--no-progress"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained data-parallel on 2 processes and continues in one" in proc.stderr


STOPS = textwrap.dedent(
    """
    import json, os, signal, sys, torch
    torch.set_num_threads(1)
    from foxhunt import DQNHyperparameters
    from foxhunt.distributed import init_from_env
    from foxhunt.errors import TrainingHalted
    from foxhunt.trainer import DQNTrainer, TrainingInterrupted
    from foxhunt.cli import _leave_process_group
    info = init_from_env("cpu")
    out, case = sys.argv[1], sys.argv[2]
    extra = {"q_divergence_bound": 1e5, "q_divergence_policy": "stop"} if case == "halt" else {}
    hp = DQNHyperparameters(hidden_sizes=(16,), batch_size=16, learning_starts=64,
                            eval_interval=0, log_interval=100, seed=3, **extra)
    trainer = DQNTrainer(hp, "CartPole-v1")
    collect = trainer.collect_step
    def collect_step():
        collect()
        if case == "interrupt" and info.rank == 1 and trainer.env_steps == 300:
            trainer._interrupt_requested = signal.SIGTERM  # as kill's SIGTERM to rank 1 sets it
    trainer.collect_step = collect_step
    if case == "halt" and info.rank == 1:  # only rank 1's own batch diverges, from step 5 on
        combine = trainer._combined_summary
        def diverging(summary):
            late = trainer.agent.optimizer_steps >= 5
            return combine(summary + torch.tensor([0.0, 0.0, 1e6 if late else 0.0]))
        trainer._combined_summary = diverging
    result = {"rank": info.rank}
    def enough(row):  # rank 1 alone reaches its target (a callback returning False)
        return not (case == "callback" and info.rank == 1 and row["env_steps"] >= 300)
    try:
        trainer.learn(5000, callback=enough)
        result["ended"] = "finished"
    except TrainingInterrupted as err:
        result.update(ended="interrupted", signum=int(err.signum))
    except TrainingHalted as err:
        result.update(ended="halted", why=str(err).split(":")[0])
    finally:
        trainer.close()
    result["env_steps"] = trainer.env_steps
    result["optimizer_steps"] = trainer.agent.optimizer_steps
    with open(os.path.join(out, f"{case}{info.rank}.json"), "w") as f:
        json.dump(result, f)
    _leave_process_group(wait=True)  # as the CLI does after a run, a stop or a halt
    os._exit(0)  # skip interpreter teardown: gloo threads can abort it (std::terminate)
    """
)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
@pytest.mark.parametrize("case", ["interrupt", "halt", "callback"])
def test_data_parallel_ranks_stop_together(tmp_path: Path, case: str) -> None:
    """A stop signal to one worker, a health monitor tripping on one rank's batch, or one
    rank's learn() callback asking to end stops every rank at the same boundary (rank 1 alone
    stopping left rank 0 in an all-reduce with a peer gone: a gloo "Connection closed"
    traceback and no checkpoint)."""
    import json

    for code, err in _two_ranks(tmp_path, STOPS, case, {"OMP_NUM_THREADS": "1"}):
        assert code == 0 and "Traceback" not in err, err[-2000:]
    ranks = [json.loads((tmp_path / f"{case}{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["env_steps"] == ranks[1]["env_steps"] < 5000
    assert ranks[0]["optimizer_steps"] == ranks[1]["optimizer_steps"]
    if case == "callback":  # rank 1's callback ended both runs, at one boundary
        assert all(r["ended"] == "finished" for r in ranks)
        assert 300 <= ranks[0]["env_steps"] <= 300 + 16  # the row at 300, then a boundary
    elif case == "interrupt":
        assert all(r["ended"] == "interrupted" for r in ranks)
        assert all(r["signum"] == 15 for r in ranks)  # SIGTERM, though only rank 1 got it
        assert 300 <= ranks[0]["env_steps"] <= 300 + 16
    else:  # rank 0's own batch never diverged: it halts on rank 1's, at the same step
        assert all(r["ended"] == "halted" for r in ranks), ranks
        assert all(r["why"] == "training stopped by health monitor" for r in ranks), ranks
        assert ranks[0]["optimizer_steps"] == 5


HALT_WORKER = textwrap.dedent(
    """
    import os, sys, datetime
    import numpy as np, torch, gymnasium as gym
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    from foxhunt import DQNHyperparameters
    from foxhunt.errors import TrainingHalted
    from foxhunt.trainer import DQNTrainer

    class Env(gym.Env):
        def __init__(self):
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
            self.action_space = gym.spaces.Discrete(2)
            self.t = 0
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.np_random.normal(size=4).astype(np.float32), {}
        def step(self, a):
            self.t += 1  # one rank sees a large reward after the last update before a save
            r = 1e4 if (rank == 1 and self.t == 9) else float(1 if a == 0 else -1)
            return self.np_random.normal(size=4).astype(np.float32), r, False, False, {}

    hp = DQNHyperparameters(batch_size=4, learning_starts=4, train_freq=4, buffer_capacity=64,
        gamma=0.9, eval_interval=0, log_interval=10_000, checkpoint_interval=10,
        hidden_sizes=(16,), seed=0)
    trainer = DQNTrainer(hp, Env)
    real = trainer.train_step
    def train_step():  # the second update blows the output layer up
        metrics = real()
        if trainer.agent.optimizer_steps == 2:
            with torch.no_grad():
                for p in list(trainer.agent.online_net.parameters())[-2:]:
                    p.mul_(1e4)
        return metrics
    trainer.train_step = train_step
    try:
        trainer.learn(40)
        outcome = "finished"
    except TrainingHalted as exc:
        outcome = f"halted at {trainer.env_steps}"
    with open(os.path.join(sys.argv[1], f"rank{rank}.txt"), "w") as f:
        f.write(outcome)
    sys.stdout.flush()
    os._exit(0)
    """
)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_ranks_judge_a_checkpoint_by_one_bound(tmp_path: Path) -> None:
    """Before a save every rank checks the network against the same Q bound. Rank 1's reward
    of 1e4 since the last update lifts its bound to 1e6; the blown-up network's |Q| (~7e3) lies
    between that and rank 0's own bound (100), so ranks judging alone split: rank 0 halted and
    rank 1 trained on into a collective with no peer."""
    for code, err in _two_ranks(tmp_path, HALT_WORKER, ""):
        assert code == 0, err[-2000:]
    outcomes = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert outcomes == ["finished", "finished"]


PER_WORKER = textwrap.dedent(
    """
    import json, os, sys, torch
    torch.set_num_threads(1)
    from foxhunt import DQNHyperparameters
    from foxhunt.distributed import init_from_env
    from foxhunt.trainer import DQNTrainer
    from foxhunt.cli import _leave_process_group
    info = init_from_env("cpu")
    hp = DQNHyperparameters(hidden_sizes=(16,), batch_size=16, gradient_accumulation_steps=2,
                            learning_starts=64, train_freq=8, prioritized_replay=True,
                            eval_interval=0, log_interval=1000, seed=5)
    trainer = DQNTrainer(hp, "CartPole-v1")
    raw, used = [], []
    sample = trainer.replay.sample_slots
    def sample_slots(*args, **kwargs):
        slots, weights = sample(*args, **kwargs)
        raw.append(weights.tolist())
        used.append([])
        return slots, weights
    trainer.replay.sample_slots = sample_slots
    backward = trainer.agent.backward_micro_batch
    def backward_micro_batch(mb, *args, **kwargs):
        used[-1].extend(mb.weights.tolist())
        return backward(mb, *args, **kwargs)
    trainer.agent.backward_micro_batch = backward_micro_batch
    trainer.learn(200)
    trainer.close()
    with open(os.path.join(sys.argv[1], f"per{info.rank}.json"), "w") as f:
        json.dump({"raw": raw, "used": used}, f)
    _leave_process_group(wait=True)
    os._exit(0)  # skip interpreter teardown: gloo threads can abort it (std::terminate)
    """
)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_prioritized_weights_are_normalised_over_every_ranks_batch(tmp_path: Path) -> None:
    """One process sampling both ranks' slots divides every importance weight by the largest
    of them all; each rank dividing by its own largest would weight the ranks' halves of one
    step differently (and the step would not equal the single-process one)."""
    import json

    for code, err in _two_ranks(tmp_path, PER_WORKER, "", {"OMP_NUM_THREADS": "1"}):
        assert code == 0 and "Traceback" not in err, err[-2000:]
    ranks = [json.loads((tmp_path / f"per{r}.json").read_text()) for r in range(2)]
    steps = len(ranks[0]["raw"])
    assert steps == len(ranks[1]["raw"]) >= 10
    differ = 0
    for k in range(steps):
        raw = [torch.tensor(r["raw"][k], dtype=torch.float64) for r in ranks]
        top = max(float(w.max()) for w in raw)
        differ += float(raw[0].max()) != float(raw[1].max())
        for r in range(2):
            used = torch.tensor(ranks[r]["used"][k], dtype=torch.float64)
            torch.testing.assert_close(used, raw[r] / top, rtol=1e-6, atol=0.0)
    assert differ >= 5  # the ranks' own maxima differ on most steps: the check has teeth
