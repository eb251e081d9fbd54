"""CartPole-v1 time to solve: foxhunt's preset vs SB3 with rl-baselines3-zoo's tuned DQN config.

"Solved" = the first greedy evaluation with a mean return >= 475 over 10 episodes. Both sides are
evaluated by the same function, every ``EVAL_EVERY`` environment steps, on the same evaluation
seeds; the evaluation time is EXCLUDED from the wall clock of both (the clock also starts after
model construction, at the call to ``learn``). A seed that never solves within the 5e4-step budget
counts with the full budget (censored) in the medians, and is flagged in the JSON. Seeds alternate
the side that runs first, so a burst of load from other users does not always hit the same one.

Run: ``python benchmarks/cartpole_time_to_solve.py [--smoke] [--out FILE.json] [--seeds 5]
[--foxhunt-set KEY=VALUE ...]``
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

ENV_ID = "CartPole-v1"
THRESHOLD = 475.0

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (SB3's max_grad_norm default is 10).
ZOO_CARTPOLE: dict[str, Any] = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    policy_kwargs=dict(net_arch=[256, 256]),
)


class _Solved(Exception):
    """Raised from a callback to stop a foxhunt run as soon as it is solved."""


def greedy_return(policy: Callable[[np.ndarray], int], seed: int, episodes: int) -> float:
    """Mean return of ``policy`` over ``episodes`` episodes seeded ``seed, seed + 1, ...``."""
    env = gym.make(ENV_ID)
    total = 0.0
    try:
        for k in range(episodes):
            obs, _ = env.reset(seed=seed + k)
            done = False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy(obs))
                total += float(reward)
                done = bool(terminated or truncated)
    finally:
        env.close()
    return total / episodes


class Clock:
    """Wall time since start, minus the time spent inside evaluations."""

    def __init__(self, eval_every: int, eval_episodes: int, eval_seed: int) -> None:
        self.eval_every, self.eval_episodes, self.eval_seed = eval_every, eval_episodes, eval_seed
        self.t0 = time.perf_counter()
        self.eval_s = 0.0
        self.history: list[tuple[int, float]] = []
        self.solved_at: int | None = None
        self.solve_wall_s: float | None = None

    def evaluate(self, env_steps: int, policy: Callable[[np.ndarray], int]) -> bool:
        """Evaluate at ``env_steps``; True once solved (the clock is then frozen)."""
        te = time.perf_counter()
        wall_before = te - self.t0 - self.eval_s
        ret = greedy_return(policy, self.eval_seed, self.eval_episodes)
        self.history.append((env_steps, ret))
        self.eval_s += time.perf_counter() - te
        if ret >= THRESHOLD and self.solved_at is None:
            self.solved_at, self.solve_wall_s = env_steps, wall_before
            return True
        return False

    def wall_s(self) -> float:
        return time.perf_counter() - self.t0 - self.eval_s


def run_foxhunt(seed: int, budget: dict[str, Any]) -> dict[str, Any]:
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters.cartpole(
        seed=seed,
        torch_threads=1,
        device="cpu",
        eval_interval=0,
        log_interval=budget["eval_every"],
        **budget["foxhunt_overrides"],
    )
    trainer = DQNTrainer(hp, ENV_ID)
    agent = trainer.agent
    torch.set_num_threads(1)

    def policy(obs: np.ndarray) -> int:
        return int(agent.greedy_actions(np.asarray(obs, np.float32))[0])

    clock = Clock(budget["eval_every"], budget["eval_episodes"], 10_000 + 100 * seed)

    def callback(row: dict[str, Any]) -> None:
        steps = int(row["env_steps"])
        if steps % clock.eval_every == 0:
            with agent.evaluation():
                if clock.evaluate(steps, policy):
                    raise _Solved

    clock.t0 = time.perf_counter()
    with contextlib.suppress(_Solved):
        trainer.learn(budget["max_steps"], callback=callback)
    wall = clock.solve_wall_s if clock.solve_wall_s is not None else clock.wall_s()
    out = _summary("foxhunt", seed, clock, wall, trainer.env_steps, agent.optimizer_steps, budget)
    trainer.close()
    return out


def run_sb3(seed: int, budget: dict[str, Any]) -> dict[str, Any]:
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    model = DQN(
        "MlpPolicy",
        ENV_ID,
        seed=seed,
        device="cpu",
        verbose=0,
        **{**ZOO_CARTPOLE, **budget["sb3_overrides"]},
    )
    model.set_logger(Logger(folder=None, output_formats=[]))  # no SB3-<date> folder in /tmp
    torch.set_num_threads(1)
    clock = Clock(budget["eval_every"], budget["eval_episodes"], 10_000 + 100 * seed)

    def policy(obs: np.ndarray) -> int:
        return int(model.predict(obs, deterministic=True)[0])

    class EvalStop(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % clock.eval_every == 0:
                return not clock.evaluate(self.num_timesteps, policy)
            return True

    clock.t0 = time.perf_counter()
    model.learn(total_timesteps=budget["max_steps"], callback=EvalStop())
    wall = clock.solve_wall_s if clock.solve_wall_s is not None else clock.wall_s()
    out = _summary("sb3", seed, clock, wall, model.num_timesteps, model._n_updates, budget)
    model.env.close()
    return out


def _summary(
    impl: str, seed: int, clock: Clock, wall: float, steps: int, updates: int, budget: dict
) -> dict[str, Any]:
    solved = clock.solved_at is not None
    return {
        "impl": impl,
        "seed": seed,
        "solved": solved,
        "env_steps_to_solve": clock.solved_at if solved else budget["max_steps"],
        "wall_s_to_solve": wall,
        "censored": not solved,
        "env_steps_run": int(steps),
        "optimizer_steps": int(updates),
        "eval_s_excluded": clock.eval_s,
        "best_eval_return": max((r for _, r in clock.history), default=None),
        "evals": clock.history,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=None, help="seeds per side (default 5; smoke 1)")
    p.add_argument(
        "--first-seed", type=int, default=0, help="seeds run first-seed .. first-seed + seeds - 1"
    )
    p.add_argument(
        "--foxhunt-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a foxhunt hyperparameter (e.g. double_q=false) to study a variant",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.smoke:
        # Tiny budget: exercises collection, training, evaluation and both callbacks, nothing more.
        small = dict(learning_starts=128, train_freq=64, gradient_steps=4)
        budget = dict(
            max_steps=512,
            eval_every=256,
            eval_episodes=2,
            foxhunt_overrides={**small, "buffer_capacity": 1000},
            sb3_overrides={**small, "buffer_size": 1000},
        )
        n_seeds = args.seeds or 1
    else:
        budget = dict(
            max_steps=50_000,
            eval_every=1024,
            eval_episodes=10,
            foxhunt_overrides={},
            sb3_overrides={},
        )
        n_seeds = args.seeds or 5
    from foxhunt.config import parse_override

    budget["foxhunt_overrides"].update(dict(parse_override(item) for item in args.foxhunt_set))
    runs: list[dict[str, Any]] = []
    for seed in range(args.first_seed, args.first_seed + n_seeds):
        order = [run_foxhunt, run_sb3] if seed % 2 == 0 else [run_sb3, run_foxhunt]
        for fn in order:
            r = fn(seed, budget)
            runs.append(r)
            print(
                f"seed {seed} {r['impl']:8s} solved={r['solved']} "
                f"steps={r['env_steps_to_solve']} wall={r['wall_s_to_solve']:.1f}s",
                flush=True,
            )
    results = []
    med: dict[str, dict[str, float]] = {}
    for impl in ("foxhunt", "sb3"):
        mine = [r for r in runs if r["impl"] == impl]
        med[impl] = {
            "wall_s": C.median([r["wall_s_to_solve"] for r in mine]),
            "env_steps": C.median([float(r["env_steps_to_solve"]) for r in mine]),
        }
        results.append(
            {
                "impl": impl,
                "seeds": len(mine),
                "solved": sum(r["solved"] for r in mine),
                "median_wall_s_to_solve": med[impl]["wall_s"],
                "median_env_steps_to_solve": med[impl]["env_steps"],
                "runs": mine,
            }
        )
    ratios = {
        "foxhunt_vs_sb3_wall_time_to_solve": med["foxhunt"]["wall_s"] / med["sb3"]["wall_s"],
        "foxhunt_vs_sb3_env_steps_to_solve": med["foxhunt"]["env_steps"] / med["sb3"]["env_steps"],
    }
    table = C.md_table(
        ["impl", "solved / seeds", "median wall s to solve", "median env steps to solve"],
        [
            [
                r["impl"],
                f"{r['solved']}/{r['seeds']}",
                r["median_wall_s_to_solve"],
                r["median_env_steps_to_solve"],
            ]
            for r in results
        ],
    ) + (
        f"\n\nfoxhunt / SB3 wall time: {ratios['foxhunt_vs_sb3_wall_time_to_solve']:.3f}, "
        f"env steps: {ratios['foxhunt_vs_sb3_env_steps_to_solve']:.3f}"
    )
    config = {
        "env": ENV_ID,
        "threshold": THRESHOLD,
        "max_env_steps": budget["max_steps"],
        "eval_every_env_steps": budget["eval_every"],
        "eval_episodes": budget["eval_episodes"],
        "eval_time": "excluded from the wall clock on both sides",
        "foxhunt": "DQNHyperparameters.cartpole() (eval_interval=0: the benchmark evaluates), "
        f"overrides {budget['foxhunt_overrides']}",
        "sb3": f"rl-baselines3-zoo CartPole-v1 DQN {ZOO_CARTPOLE}, overrides "
        f"{budget['sb3_overrides']}",
        "torch_threads": 1,
    }
    notes = (
        "Unsolved seeds count with the full budget (censored). Evaluations use the same "
        "function and seeds for both sides; the clock starts at learn()."
    )
    return C.finish("cartpole_time_to_solve", args, config, results, ratios, notes, table)


if __name__ == "__main__":
    main()
