"""Classic control beyond CartPole: foxhunt's default for a Gymnasium env vs SB3, side by side.

What a user comparing libraries runs first: ``foxhunt train --env ID`` (the ``classic`` preset
every Gymnasium env gets), foxhunt's plain ``DQNHyperparameters()`` defaults (the ``default``
preset, which was the default for envs other than CartPole), SB3's ``DQN("MlpPolicy", env)``
defaults, and SB3 with rl-baselines3-zoo's tuned DQN configuration for that env. Each trains for
the zoo's step budget, then plays 20 greedy episodes on seeds 10 000..10 019 (the same for all).
Wall time is training only; foxhunt's periodic evaluations are switched off so both sides do the
same work. One torch thread per run; ``--jobs`` runs several processes at once.

LunarLander-v3 runs with ``--envs LunarLander-v3`` (it needs ``pip install box2d pygame``, which
the benchmark extra leaves out); ``--configs`` picks configurations.

Run: ``python benchmarks/classic_control.py [--smoke] [--out FILE.json] [--seeds 0 1]
[--jobs 2] [--envs ID ...] [--configs NAME ...]``
"""

from __future__ import annotations

import time
from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

# rl-baselines3-zoo's hyperparams/dqn.yml gives Acrobot-v1 and LunarLander-v3 the same settings.
_ZOO_ACROBOT_LUNARLANDER: dict[str, Any] = dict(
    learning_rate=6.3e-4,
    batch_size=128,
    buffer_size=50_000,
    learning_starts=0,
    gamma=0.99,
    target_update_interval=250,
    train_freq=4,
    gradient_steps=-1,
    exploration_fraction=0.12,
    exploration_final_eps=0.1,
    policy_kwargs=dict(net_arch=[256, 256]),
)
# Env -> (zoo step budget, rl-baselines3-zoo hyperparams/dqn.yml).
ZOO: dict[str, tuple[int, dict[str, Any]]] = {
    "Acrobot-v1": (100_000, _ZOO_ACROBOT_LUNARLANDER),
    "MountainCar-v0": (
        120_000,
        dict(
            learning_rate=4e-3,
            batch_size=128,
            buffer_size=10_000,
            learning_starts=1000,
            gamma=0.98,
            target_update_interval=600,
            train_freq=16,
            gradient_steps=8,
            exploration_fraction=0.2,
            exploration_final_eps=0.07,
            policy_kwargs=dict(net_arch=[256, 256]),
        ),
    ),
    "LunarLander-v3": (100_000, _ZOO_ACROBOT_LUNARLANDER),
}
DEFAULT_ENVS = ("Acrobot-v1", "MountainCar-v0")
CONFIGS = ("foxhunt classic", "foxhunt default", "sb3 default", "sb3 zoo")
EVAL_SEED, EVAL_EPISODES = 10_000, 20


def greedy_return(act: Any, env_id: str, episodes: int) -> float:
    """Mean return of ``act(obs) -> action`` over ``episodes`` seeded episodes."""
    env = gym.make(env_id)
    total = 0.0
    try:
        for k in range(episodes):
            obs, _ = env.reset(seed=EVAL_SEED + k)
            done = False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                total += float(reward)
                done = terminated or truncated
    finally:
        env.close()
    return total / episodes


def run_one(
    env_id: str, config: str, seed: int, steps: int, episodes: int, smoke: bool
) -> dict[str, Any]:
    """Train one configuration on one seed; its greedy return and training wall time (in smoke
    mode, with learning starting early enough for a few updates)."""
    torch.set_num_threads(1)
    if config.startswith("foxhunt"):
        from foxhunt.runs import build_spec
        from foxhunt.trainer import DQNTrainer

        preset = config.split()[1]
        spec = build_spec(env=env_id, preset_name=preset, seed=seed, total_steps=steps)
        hp = spec.hyperparameters.replace(eval_interval=0, torch_threads=1)
        if smoke:
            hp = hp.replace(learning_starts=hp.effective_batch_size)
        trainer = DQNTrainer(hp, env_id)
        try:
            t0 = time.perf_counter()
            trainer.learn(steps)
            wall = time.perf_counter() - t0
            agent = trainer.agent
            with agent.evaluation():
                ret = greedy_return(agent.predict, env_id, episodes)
        finally:
            trainer.close()
    else:
        from stable_baselines3 import DQN

        kwargs = dict(ZOO[env_id][1]) if config == "sb3 zoo" else {}
        if smoke:
            kwargs["learning_starts"] = min(kwargs.get("learning_starts", 100), 100)
        model = DQN("MlpPolicy", env_id, seed=seed, device="cpu", verbose=0, **kwargs)
        t0 = time.perf_counter()
        model.learn(steps)
        wall = time.perf_counter() - t0
        ret = greedy_return(
            lambda obs: int(model.predict(obs, deterministic=True)[0]), env_id, episodes
        )
    return {
        "env": env_id,
        "config": config,
        "seed": seed,
        "env_steps": steps,
        "greedy_return": ret,
        "train_wall_s": wall,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    p.add_argument("--envs", nargs="+", choices=list(ZOO), default=list(DEFAULT_ENVS))
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    args = p.parse_args(argv)
    envs = args.envs
    configs = [c for c in CONFIGS if c in args.configs]
    seeds = args.seeds[:1] if args.smoke else args.seeds
    episodes = 1 if args.smoke else EVAL_EPISODES
    jobs = [
        (env_id, config, seed, 600 if args.smoke else ZOO[env_id][0], episodes, args.smoke)
        for env_id in envs
        for seed in seeds
        for config in configs
    ]
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.starmap(run_one, jobs)
    else:
        results = [run_one(*job) for job in jobs]
    summary: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    for env_id in envs:
        for config in configs:
            runs = [r for r in results if r["env"] == env_id and r["config"] == config]
            summary.append(
                {
                    "env": env_id,
                    "config": config,
                    "mean_greedy_return": float(np.mean([r["greedy_return"] for r in runs])),
                    "per_seed": [r["greedy_return"] for r in runs],
                    "median_train_wall_s": C.median([r["train_wall_s"] for r in runs]),
                    "runs": runs,
                }
            )
        wall = {s["config"]: s["median_train_wall_s"] for s in summary if s["env"] == env_id}
        if "foxhunt classic" in wall and "sb3 zoo" in wall:
            ratios[f"{env_id}_foxhunt_classic_vs_sb3_zoo_wall_time"] = (
                wall["foxhunt classic"] / wall["sb3 zoo"]
            )
    table = C.md_table(
        ["env", "configuration", "greedy return, mean", "per seed", "train wall s (median)"],
        [
            [
                s["env"],
                s["config"],
                s["mean_greedy_return"],
                ", ".join(f"{v:.1f}" for v in s["per_seed"]),
                s["median_train_wall_s"],
            ]
            for s in summary
        ],
    )
    config = {
        "envs": {k: {"env_steps": ZOO[k][0], "sb3_zoo": ZOO[k][1]} for k in envs},
        "configs": configs,
        "seeds": seeds,
        "eval_episodes": episodes,
        "eval_seeds_from": EVAL_SEED,
        "torch_threads": 1,
        "jobs": args.jobs,
    }
    notes = (
        "greedy returns after the zoo's step budget; foxhunt classic = what `foxhunt train --env "
        "ID` runs, foxhunt default = DQNHyperparameters() (--preset default); wall time is "
        "training only, evaluations off on both sides"
    )
    return C.finish("classic_control", args, config, summary, ratios, notes, table)


if __name__ == "__main__":
    main()
