"""CNN learner step: foxhunt's ``torso="cnn"`` vs Stable-Baselines3's DQN ``CnnPolicy``, updates/s.

Both sides run the same update on the same Atari-shaped replay: 4 stacked 84x84 uint8 frames,
6 actions, the Nature DQN network (three convolutions, 512 units, one linear head: SB3's
``CnnPolicy`` default for DQN, foxhunt's ``torso="cnn"`` with ``hidden_sizes=[512]``), plain
(not double) DQN as SB3's is, Huber loss, global-norm clipping at 10, Adam, batch 32, one torch
thread, and replay sampling (with the uint8 -> float conversion) inside every update. Both replays
hold the same random frames. Contenders run interleaved, several repetitions, medians reported.

Run: ``python benchmarks/cnn_learner.py [--smoke] [--out FILE.json]``
"""

from __future__ import annotations

from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

SHAPE, N_ACTIONS, BATCH, GAMMA, LR, MAX_NORM = (4, 84, 84), 6, 32, 0.99, 1e-4, 10.0


class Frames(gym.Env):
    """An env with Atari's spaces only (nothing steps it: replay is filled directly)."""

    observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(N_ACTIONS)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        return np.zeros(SHAPE, np.uint8), {}

    def step(self, action: int):  # type: ignore[override]
        return np.zeros(SHAPE, np.uint8), 0.0, False, False, {}


def random_frames(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8),
        "next_obs": rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8),
        "actions": rng.integers(0, N_ACTIONS, n).astype(np.int64),
        "rewards": rng.standard_normal(n).astype(np.float32),
        "dones": (rng.random(n) < 0.05).astype(np.float32),
    }


def make_foxhunt(data: dict[str, np.ndarray], compile: bool = False) -> Any:
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    n = len(data["actions"])
    hp = DQNHyperparameters(
        torso="cnn",
        hidden_sizes=(512,),
        double_q=False,
        learning_rate=LR,
        gamma=GAMMA,
        batch_size=BATCH,
        buffer_capacity=n,
        learning_starts=BATCH,
        max_grad_norm=MAX_NORM,
        optimizer="adam",
        target_update_interval=10**9,
        compile=compile,
        device="cpu",
        torch_threads=1,
        eval_interval=0,
        n_envs=1,
        seed=0,
    )
    trainer = DQNTrainer(hp, Frames)
    scale = np.float32(1 / 255)  # what the pixel wrapper hands replay: levels x 1/255
    for lo in range(0, n, 256):
        sl = slice(lo, lo + 256)
        trainer.replay.add(
            data["obs"][sl].astype(np.float32) * scale,
            data["actions"][sl],
            data["rewards"][sl],
            data["next_obs"][sl].astype(np.float32) * scale,
            data["dones"][sl],
            np.full(len(data["actions"][sl]), GAMMA, np.float32),
        )
    assert trainer.replay.obs.dtype == torch.uint8  # kept as levels, as SB3 keeps them
    return trainer


def make_sb3(data: dict[str, np.ndarray]) -> Any:
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import Logger

    n = len(data["actions"])
    model = DQN(
        "CnnPolicy",
        Frames(),
        learning_rate=LR,
        buffer_size=n,
        learning_starts=0,
        batch_size=BATCH,
        gamma=GAMMA,
        train_freq=1,
        gradient_steps=1,
        target_update_interval=10**9,
        max_grad_norm=MAX_NORM,
        optimize_memory_usage=False,
        device="cpu",
        seed=0,
    )
    model.set_logger(Logger(folder=None, output_formats=[]))
    rb = model.replay_buffer
    assert rb is not None and rb.buffer_size == n and rb.observations.dtype == np.uint8
    C.fill_sb3_replay(rb, data)
    return model


def params(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parser(__doc__.splitlines()[0]).parse_args(argv)
    n_fill, n_updates, reps = (300, 3, 2) if args.smoke else (5_000, 20, 15)
    torch.set_num_threads(1)
    data = random_frames(n_fill)
    fox, fox_compiled, sb3 = make_foxhunt(data), make_foxhunt(data, compile=True), make_sb3(data)
    torch.set_num_threads(1)  # after construction: nothing may have changed it back
    assert params(fox.agent.online_net) == params(sb3.q_net), "not the same network"

    def steps(trainer: Any) -> Any:
        def run() -> float:
            return n_updates / C.timed(lambda: [trainer.train_step() for _ in range(n_updates)])

        return run

    runners = {
        "foxhunt": steps(fox),
        "foxhunt_compiled": steps(fox_compiled),
        "sb3": lambda: n_updates / C.timed(lambda: sb3.train(n_updates, batch_size=BATCH)),
    }
    for run in runners.values():  # warm-up: allocator, optimizer state, compilation
        run()
    per_rep = C.interleaved(runners, reps)
    med = {k: C.median(v) for k, v in per_rep.items()}
    paired = C.median(C.per_rep_ratios(per_rep["foxhunt"], per_rep["sb3"]))
    paired_compiled = C.median(C.per_rep_ratios(per_rep["foxhunt_compiled"], per_rep["sb3"]))
    ratios = {
        "foxhunt_vs_sb3_updates_per_s": med["foxhunt"] / med["sb3"],
        "foxhunt_vs_sb3_updates_per_s_paired": paired,
        "foxhunt_compiled_vs_sb3_updates_per_s_paired": paired_compiled,
    }
    results = [
        {
            "updates_per_s_median": med,
            "updates_per_s_reps": per_rep,
            "parameters": params(fox.agent.online_net),
            "foxhunt_compiled_learner_path": fox_compiled.agent.learner_path,
        }
    ]
    table = C.md_table(
        ["foxhunt", "compiled", "SB3 CnnPolicy", "foxhunt / SB3 (paired)", "compiled / SB3"],
        [[med["foxhunt"], med["foxhunt_compiled"], med["sb3"], paired, paired_compiled]],
    )
    config = {
        "frames": list(SHAPE),
        "actions": N_ACTIONS,
        "batch_size": BATCH,
        "replay": n_fill,
        "updates_per_rep": n_updates,
        "reps": reps,
        "torch_threads": 1,
    }
    notes = "updates/s, medians over interleaved repetitions; Nature DQN network both sides"
    return C.finish("cnn_learner", args, config, results, ratios, notes, table)


if __name__ == "__main__":
    main()
