"""Trading peer check: Stable-Baselines3's DQN on the very TradingEnv `foxhunt train` trains on.

For each seed, builds the training env of `foxhunt train --seed S` through foxhunt's own API (the
default synthetic market, the HMM detector fitted on its training span with seed S, observation =
one-hot position + regime probabilities, the preset's costs and episodes), trains SB3's DQN on it
with the `trading` preset's settings as far as SB3 has them, trains foxhunt's default agent for
the same seed beside it, and backtests both greedily on the test span with foxhunt's backtest.
A second implementation landing where foxhunt lands says the environment, the backtest and the
trainer's figures can be trusted; the wall times are measured side by side.

    python benchmarks/trading_sb3_peer.py --seeds 0 1 2 3 4    # 60 000 env steps per run
    python benchmarks/trading_sb3_peer.py --smoke              # seconds; checks the plumbing

What SB3's DQN cannot express: double Q (its target is max_a Q_target), the dueling and
regime-conditional heads, 5-step returns (it takes 1-step), 4 accumulated micro-batches of 64
(it takes one batch of 256: the same expected gradient), target syncs counted in optimizer steps
(it counts env steps: 1000 syncs x train_freq 4 = 4000).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from foxhunt import backtest as bt  # noqa: E402
from foxhunt.runs import build_spec, build_trading, load_model, model_policy  # noqa: E402
from foxhunt.session import train_run  # noqa: E402

TOTAL = 60_000


def sb3_settings(hp: Any, total: int) -> dict[str, Any]:
    """SB3 DQN keyword arguments nearest to foxhunt's hyperparameters ``hp``."""
    opt_steps = max(1.0, (total - hp.learning_starts) / hp.train_freq)  # the decay's length

    def cosine_lr(progress_remaining: float) -> float:
        # SB3 passes 1 - num_timesteps / total; foxhunt decays over the optimizer steps from
        # the first update (learning_starts) to the run's last one, down to lr_final_ratio.
        env_step = (1.0 - progress_remaining) * total
        frac = min(1.0, max(0.0, (env_step - hp.learning_starts) / hp.train_freq) / opt_steps)
        cos = 0.5 * (1.0 + math.cos(math.pi * frac))
        return hp.learning_rate * (hp.lr_final_ratio + (1.0 - hp.lr_final_ratio) * cos)

    return {
        "learning_rate": cosine_lr,
        "buffer_size": hp.buffer_capacity,
        "learning_starts": hp.learning_starts,
        "batch_size": hp.batch_size * hp.gradient_accumulation_steps,
        "tau": hp.tau,
        "gamma": hp.gamma,
        "train_freq": hp.train_freq,
        "gradient_steps": hp.gradient_steps,
        "target_update_interval": hp.target_update_interval * hp.train_freq,
        "exploration_fraction": hp.exploration_fraction,
        "exploration_initial_eps": hp.exploration_initial_eps,
        "exploration_final_eps": hp.exploration_final_eps,
        "max_grad_norm": hp.max_grad_norm,
        "policy_kwargs": {
            "net_arch": list(hp.hidden_sizes),
            "activation_fn": torch.nn.ReLU,
            "optimizer_class": torch.optim.Adam,
            "optimizer_kwargs": {"eps": hp.adam_eps},
        },
    }  # the loss: SB3's smooth_l1 is Huber with delta 1, foxhunt's default


def sb3_policy(model: Any) -> Any:
    """A greedy obs -> action function, as ``runs.model_policy`` makes for a foxhunt agent,
    with ``q_batch`` for the batched backtest."""
    q_net = model.policy.q_net
    q_net.eval()
    width = int(q_net.observation_space.shape[0])

    @torch.inference_mode()
    def q_batch(obs: Any) -> np.ndarray:
        return q_net(torch.as_tensor(np.asarray(obs, dtype=np.float32)).reshape(-1, width)).numpy()

    def act(obs: Any) -> int:
        return int(q_batch(obs)[0].argmax())

    act.q_batch = q_batch  # type: ignore[attr-defined]
    return act


def backtest(setup: Any, act: Any) -> dict[str, float]:
    """The test-span figures `foxhunt evaluate --split test` reports for ``act``."""
    span, config = setup.span("test", closing=True), setup.config
    ppy = bt.infer_periods_per_year(setup.market.timestamps)
    agent = bt.run_policy(span, act, config, "agent", periods_per_year=ppy)
    oracle = bt.regime_oracle(span, config, setup.span("train"), periods_per_year=ppy)
    rule = bt.regime_rule(span, config, setup.span("train"), periods_per_year=ppy)
    hold = bt.buy_and_hold(span, config, periods_per_year=ppy)
    return {
        "total_log_return": agent.metrics["total_log_return"],
        "sharpe": agent.metrics["sharpe"],
        "oracle_capture": bt.oracle_capture(agent, oracle),
        "regime_rule": rule.metrics["total_log_return"],
        "buy_and_hold": hold.metrics["total_log_return"],
        "regime_oracle": oracle.metrics["total_log_return"],
    }


def run_seed(seed: int, total: int, work: Path) -> dict[str, Any]:
    from stable_baselines3 import DQN

    torch.set_num_threads(1)
    spec = build_spec(seed=seed, total_steps=total)
    setup = build_trading(spec)  # the market `foxhunt train --seed S` fits (detector seed S)
    model = DQN(
        "MlpPolicy",
        setup.train_env(),
        seed=seed,
        device="cpu",
        verbose=0,
        **sb3_settings(spec.hyperparameters, total),
    )
    t0 = time.perf_counter()
    model.learn(total_timesteps=total)
    sb3_s = time.perf_counter() - t0
    sb3 = backtest(setup, sb3_policy(model))

    run_dir = work / f"foxhunt-seed{seed}"
    t0 = time.perf_counter()
    train_run(spec, run_dir, progress=False, verbose=False)
    foxhunt_s = time.perf_counter() - t0
    foxhunt = backtest(setup, model_policy(load_model(run_dir, "final")))
    return {"seed": seed, "env_steps": total, "seconds": {"sb3": sb3_s, "foxhunt": foxhunt_s},
            "sb3": sb3, "foxhunt": foxhunt}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = p.parse_args(argv)
    total, seeds = (600, [0]) if args.smoke else (TOTAL, args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_seed(s, total, Path(tmp)) for s in seeds]
    ratios = {
        "foxhunt_vs_sb3_wall_time": C.median(
            [r["seconds"]["foxhunt"] / r["seconds"]["sb3"] for r in results]
        )
    }
    mean = {
        k: float(np.mean([r[k]["total_log_return"] for r in results])) for k in ("sb3", "foxhunt")
    }
    table = C.md_table(
        [
            "seed",
            "SB3 DQN log return (Sharpe)",
            "foxhunt log return (Sharpe)",
            "SB3 s",
            "foxhunt s",
        ],
        [
            [
                r["seed"],
                f"{r['sb3']['total_log_return']:.3f} ({r['sb3']['sharpe']:.2f})",
                f"{r['foxhunt']['total_log_return']:.3f} ({r['foxhunt']['sharpe']:.2f})",
                round(r["seconds"]["sb3"], 1),
                round(r["seconds"]["foxhunt"], 1),
            ]
            for r in results
        ],
    )
    first = results[0]["sb3"]
    notes = (
        f"Test span of the default synthetic market, {total} env steps per run, one thread. Mean "
        f"test log return: SB3 DQN {mean['sb3']:.3f}, foxhunt {mean['foxhunt']:.3f}; regime rule "
        f"{first['regime_rule']:.3f}, buy & hold {first['buy_and_hold']:.3f}, regime oracle "
        f"{first['regime_oracle']:.3f} (seed {seeds[0]}'s detector)."
    )
    config = {"env_steps": total, "seeds": seeds, "mean_total_log_return": mean}
    return C.finish("trading_sb3_peer", args, config, results, ratios, notes, table)


if __name__ == "__main__":
    main()
