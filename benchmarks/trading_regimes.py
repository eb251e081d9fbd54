"""Out-of-sample trading benchmark on the default synthetic market (issue 4).

Trains the regime-conditional agent (the ``trading`` preset that ``foxhunt train`` uses) and a
plain DQN (the same preset with one head instead of per-regime heads) for several seeds, then
backtests both on the test span against buy-and-hold, flat, the regime rule (each detector
state's training-span direction: what the regime input alone is worth) and the regime oracle.

    python benchmarks/trading_regimes.py --jobs 2        # 20 seeds, the preset's step budget
    python benchmarks/trading_regimes.py --smoke         # seconds; checks the plumbing only
    python benchmarks/trading_regimes.py --market-seeds $(seq 1 20) --seeds 0 --jobs 2
                                            # 20 other markets: is the default market typical?
    python benchmarks/trading_regimes.py --jobs 2 --variants plain_dqn --set market.n_regimes=1 \
        --set market.features=null --set trading.window=1
                                            # a DQN with no regime model: price features only
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from foxhunt.config import parse_override
from foxhunt.runs import build_spec
from foxhunt.session import evaluate_run, run_training

RESULTS = Path(__file__).parent / "results"
VARIANTS = ("regime_conditional", "plain_dqn")


def run_one(
    seed: int,
    variant: str,
    steps: int | None,
    smoke: bool,
    root: Path,
    market_seed: int = 0,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    torch.set_num_threads(1)
    overrides: dict[str, Any] = {"market.synthetic_seed": market_seed, **(settings or {})}
    if variant == "plain_dqn":
        overrides["regime_conditional"] = False
    if smoke:
        overrides.update(learning_starts=300, hidden_sizes=[16], eval_interval=0, log_interval=200)
    spec = build_spec(seed=seed, total_steps=steps, overrides=overrides)
    run_dir = root / f"{variant}-{seed}-market{market_seed}"
    t0 = time.perf_counter()
    run_training(spec, run_dir, progress=False)
    train_s = time.perf_counter() - t0
    out = evaluate_run(run_dir, split="test", model="final")
    m = out["metrics"]
    oracle = next(k for k in m if "oracle" in k)
    return {
        "seed": seed,
        "market_seed": market_seed,
        "variant": variant,
        "env_steps": spec.total_env_steps,
        "train_seconds": round(train_s, 1),
        "agent_log_return": m["agent"]["total_log_return"],
        "agent_sharpe": m["agent"]["sharpe"],
        "buy_and_hold_log_return": m["buy & hold"]["total_log_return"],
        "buy_and_hold_sharpe": m["buy & hold"]["sharpe"],
        # The regime rule needs a detector with states (not detector: none).
        "regime_rule_log_return": m.get("regime rule", {}).get("total_log_return"),
        "regime_rule_sharpe": m.get("regime rule", {}).get("sharpe"),
        "oracle_log_return": m[oracle]["total_log_return"],
        "oracle_capture": out["oracle_capture"],
    }


def _baseline(rows: list[dict[str, Any]], name: str) -> dict[str, float] | None:
    """A baseline's figures, averaged over the markets (each market once: they do not depend on
    the agent's seed)."""
    per_market = {r["market_seed"]: r for r in rows}.values()
    if any(r[f"{name}_log_return"] is None for r in per_market):
        return None
    mean = statistics.fmean(r[f"{name}_log_return"] for r in per_market)
    return {
        "agent_log_return": mean,
        "agent_sharpe": statistics.fmean(r[f"{name}_sharpe"] for r in per_market),
        "oracle_capture": mean / statistics.fmean(r["oracle_log_return"] for r in per_market),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for variant in sorted({r["variant"] for r in rows}):
        rs = [r for r in rows if r["variant"] == variant]
        out[variant] = {
            k: statistics.fmean(r[k] for r in rs) for k in ("agent_log_return", "agent_sharpe")
        }
        # The share of the oracle's total, not the mean of per-market shares: a market whose
        # oracle earns about nothing (or loses) would make its own share meaningless.
        out[variant]["oracle_capture"] = out[variant]["agent_log_return"] / statistics.fmean(
            r["oracle_log_return"] for r in rs
        )
        returns = [r["agent_log_return"] for r in rs]
        out[variant].update(
            median_log_return=statistics.median(returns),
            min_log_return=min(returns),
            max_log_return=max(returns),
        )
    for name in ("buy_and_hold", "regime_rule"):
        figures = _baseline(rows, name)
        if figures is not None:
            out[name] = figures
    return out


def paired(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (market, seed), regime-conditional minus plain DQN: the comparison they share."""
    by = {(r["market_seed"], r["seed"], r["variant"]): r["agent_log_return"] for r in rows}
    both = ("plain_dqn", "regime_conditional")
    pairs = sorted({(m, s) for m, s, _ in by if all((m, s, v) in by for v in both)})
    diffs = [by[m, s, "regime_conditional"] - by[m, s, "plain_dqn"] for m, s in pairs]
    return {
        "seeds": [s for _, s in pairs],
        "market_seeds": [m for m, _ in pairs],
        "regime_conditional_minus_plain": diffs,
        "regime_conditional_wins": sum(d > 0 for d in diffs),
        "mean_difference": statistics.fmean(diffs) if diffs else None,
        "stderr_of_difference": statistics.stdev(diffs) / len(diffs) ** 0.5
        if len(diffs) > 1
        else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(20)))
    p.add_argument("--steps", type=int, default=None, help="env steps (default: the preset's)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    p.add_argument(
        "--market-seeds",
        type=int,
        nargs="+",
        default=[0],
        help="synthetic markets to run on (default: 0, the default market)",
    )
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for both agents, as `foxhunt train --set` takes it; repeatable",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="the agents to train (default: both); the paired comparison needs both",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    settings = dict(parse_override(item) for item in args.settings)
    torch.set_num_threads(1)
    steps = 600 if args.smoke else args.steps
    seeds = args.seeds[:1] if args.smoke else args.seeds
    markets = args.market_seeds[:1] if args.smoke else args.market_seeds
    jobs = [(m, s, v) for m in markets for s in seeds for v in dict.fromkeys(args.variants)]
    with tempfile.TemporaryDirectory() as tmp:
        if args.jobs > 1:
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(args.jobs) as pool:
                rows = pool.starmap(
                    run_one,
                    [(s, v, steps, args.smoke, Path(tmp), m, settings) for m, s, v in jobs],
                )
        else:
            rows = [run_one(s, v, steps, args.smoke, Path(tmp), m, settings) for m, s, v in jobs]
    for row in rows:
        print(json.dumps(row), flush=True)
    result = {
        "benchmark": "trading_regimes",
        "smoke": args.smoke,
        "rows": rows,
        "market_seeds": markets,
        "settings": settings,
        "mean": summarise(rows),
        "paired": paired(rows),
    }
    market = "" if markets == [0] else f"_markets{min(markets)}-{max(markets)}"
    out = args.out or RESULTS / (
        "trading_regimes.smoke.json" if args.smoke else f"trading_regimes{market}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print("\n| strategy | test log return | Sharpe | share of oracle log return |")
    print("| --- | --- | --- | --- |")
    for name, m in result["mean"].items():
        print(
            f"| {name} | {m['agent_log_return']:.3f} | {m['agent_sharpe']:.2f} | "
            f"{m['oracle_capture']:.2f} |"
        )
    pr = result["paired"]
    if pr["seeds"]:
        print(
            "\nregime-conditional minus plain DQN, per (market, seed): wins "
            f"{pr['regime_conditional_wins']} of {len(pr['seeds'])}, "
            f"mean {pr['mean_difference']:+.3f}"
            + (
                f" (standard error {pr['stderr_of_difference']:.3f})"
                if pr["stderr_of_difference"]
                else ""
            )
        )
    return result


if __name__ == "__main__":
    main()
