"""Collection throughput: environment steps per second, foxhunt vs SB3, with 1, 4 and 8 envs.

Both sides act epsilon-greedily (epsilon fixed at 0.05) with the same policy network (MLP 256x256)
on CartPole-v1, store every transition in a preallocated replay of 1e5, and never learn:
foxhunt calls ``DQNTrainer.collect_step`` (gymnasium.vector.SyncVectorEnv), SB3 calls
``collect_rollouts`` (DummyVecEnv, its default for ``n_envs > 1``). Two environment-only loops with
uniform random actions give the ceiling each vector-env wrapper allows. One env step = one
transition, so a vector step of 8 envs counts 8.

Run: ``python benchmarks/collection_throughput.py [--smoke] [--out FILE.json]``
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import numpy as np  # noqa: E402
import torch  # noqa: E402

ENV_ID, EPS, HIDDEN = "CartPole-v1", 0.05, (256, 256)


def make_foxhunt(n_envs: int) -> Callable[[int], None]:
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters(
        n_envs=n_envs,
        batch_size=64,
        learning_starts=64,
        buffer_capacity=100_000,
        exploration_initial_eps=EPS,
        exploration_final_eps=EPS,
        hidden_sizes=HIDDEN,
        device="cpu",
        torch_threads=1,
        eval_interval=0,
        seed=0,
    )
    trainer = DQNTrainer(hp, ENV_ID)
    while trainer.env_steps < hp.learning_starts:  # past the uniform-random warm-up
        trainer.collect_step()

    def run(vec_steps: int) -> None:
        for _ in range(vec_steps):
            trainer.collect_step()

    return run


def make_sb3(n_envs: int) -> Callable[[int], None]:
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit

    env = make_vec_env(ENV_ID, n_envs=n_envs, seed=0)
    model = DQN(
        "MlpPolicy",
        env,
        buffer_size=100_000,
        learning_starts=0,
        exploration_initial_eps=EPS,
        exploration_final_eps=EPS,
        policy_kwargs=dict(net_arch=list(HIDDEN)),
        device="cpu",
        seed=0,
        verbose=0,
    )
    model.set_logger(Logger(folder=None, output_formats=[]))  # no SB3-<date> folder in /tmp
    _, callback = model._setup_learn(total_timesteps=10**9, callback=None)
    callback.on_training_start(locals(), globals())

    def run(vec_steps: int) -> None:
        model.collect_rollouts(
            model.env,
            callback=callback,
            train_freq=TrainFreq(vec_steps, TrainFrequencyUnit.STEP),
            replay_buffer=model.replay_buffer,
            learning_starts=0,
            log_interval=None,
        )

    return run


def make_env_only_gym(n_envs: int) -> Callable[[int], None]:
    from foxhunt.trainer import make_vector_env

    envs = make_vector_env(ENV_ID, n_envs)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)

    def run(vec_steps: int) -> None:
        for _ in range(vec_steps):
            envs.step(rng.integers(0, 2, size=n_envs))

    return run


def make_env_only_sb3(n_envs: int) -> Callable[[int], None]:
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(ENV_ID, n_envs=n_envs, seed=0)
    env.reset()
    rng = np.random.default_rng(0)

    def run(vec_steps: int) -> None:
        for _ in range(vec_steps):
            env.step(rng.integers(0, 2, size=n_envs))

    return run


def run_n_envs(n_envs: int, transitions: int, reps: int) -> dict[str, Any]:
    runners = {
        "foxhunt": make_foxhunt(n_envs),
        "sb3": make_sb3(n_envs),
        "env_only_gym_vector": make_env_only_gym(n_envs),
        "env_only_sb3_dummyvecenv": make_env_only_sb3(n_envs),
    }
    torch.set_num_threads(1)
    vec_steps = max(1, transitions // n_envs)
    for run in runners.values():
        run(max(1, vec_steps // 10))

    def rate(run: Callable[[int], None]) -> float:
        t0 = time.perf_counter()
        run(vec_steps)
        return vec_steps * n_envs / (time.perf_counter() - t0)

    per_rep = C.interleaved({k: (lambda r=r: rate(r)) for k, r in runners.items()}, reps)
    med = {k: C.median(v) for k, v in per_rep.items()}
    return {
        "n_envs": n_envs,
        "env_steps_per_rep": vec_steps * n_envs,
        "reps": reps,
        "env_steps_per_s_median": med,
        "env_steps_per_s_reps": per_rep,
        "ratio_foxhunt_vs_sb3": med["foxhunt"] / med["sb3"],
        "ratio_foxhunt_vs_sb3_paired_median": C.median(
            C.per_rep_ratios(per_rep["foxhunt"], per_rep["sb3"])
        ),
        "foxhunt_share_of_env_ceiling": med["foxhunt"] / med["env_only_gym_vector"],
        "sb3_share_of_env_ceiling": med["sb3"] / med["env_only_sb3_dummyvecenv"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parser(__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)
    n_list, transitions, reps = ([1, 4], 64, 2) if args.smoke else ([1, 4, 8], 1024, 21)
    results = [run_n_envs(n, transitions, reps) for n in n_list]
    ratios = {
        f"foxhunt_vs_sb3_env_steps_per_s_n{r['n_envs']}": r["ratio_foxhunt_vs_sb3"] for r in results
    }
    table = C.md_table(
        [
            "n_envs",
            "foxhunt steps/s",
            "SB3 steps/s",
            "foxhunt / SB3",
            "foxhunt / SB3 (paired reps)",
            "gym.vector env-only",
            "DummyVecEnv env-only",
            "foxhunt share of env ceiling",
            "SB3 share of env ceiling",
        ],
        [
            [
                r["n_envs"],
                r["env_steps_per_s_median"]["foxhunt"],
                r["env_steps_per_s_median"]["sb3"],
                r["ratio_foxhunt_vs_sb3"],
                r["ratio_foxhunt_vs_sb3_paired_median"],
                r["env_steps_per_s_median"]["env_only_gym_vector"],
                r["env_steps_per_s_median"]["env_only_sb3_dummyvecenv"],
                r["foxhunt_share_of_env_ceiling"],
                r["sb3_share_of_env_ceiling"],
            ]
            for r in results
        ],
    )
    config = {
        "env": ENV_ID,
        "epsilon": EPS,
        "policy": "MLP 4-256-256-2",
        "replay_capacity": 100_000,
        "learning": "disabled",
        "torch_threads": 1,
        "foxhunt": "DQNTrainer.collect_step, gymnasium.vector.SyncVectorEnv (same-step autoreset)",
        "sb3": "DQN.collect_rollouts, DummyVecEnv + Monitor (make_vec_env)",
    }
    notes = "Median env steps/s (transitions/s) over interleaved repetitions."
    return C.finish("collection_throughput", args, config, results, ratios, notes, table)


if __name__ == "__main__":
    main()
