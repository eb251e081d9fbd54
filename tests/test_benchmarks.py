"""The benchmark scripts run end to end in smoke mode (peer included) and write well-formed JSON.

Only the output format and the arithmetic of the reported ratios are checked, never a timing: the
numbers depend on the machine and its load.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

TOP_KEYS = {"benchmark", "command", "smoke", "machine", "config", "results", "ratios", "notes"}


def _run(name: str, tmp_path: Path) -> dict[str, Any]:
    module = importlib.import_module(name)
    out = tmp_path / f"{name}.json"
    returned = module.main(["--smoke", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))  # the file holds exactly what was reported
    assert set(written) == TOP_KEYS
    assert written["benchmark"] == name
    assert written["smoke"] is True
    assert written["command"] == f"python benchmarks/{name}.py --smoke"
    machine = written["machine"]
    assert machine["cpu_model"] and machine["logical_cores"] >= 1 and machine["torch_threads"] >= 1
    assert machine["torch"]
    assert written["results"] and isinstance(written["results"], list)
    ratios = written["ratios"]
    assert ratios
    for key, value in ratios.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left no temp file behind
    return written


def _positive(d: dict[str, float]) -> None:
    for k, v in d.items():
        assert isinstance(v, float) and math.isfinite(v) and v > 0, (k, v)


def test_learner_throughput_smoke(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    out = _run("learner_throughput", tmp_path)
    assert [r["batch_size"] for r in out["results"]] == [64, 256]
    for r in out["results"]:
        med = r["updates_per_s_median"]
        assert set(med) == {
            "foxhunt",
            "foxhunt_double_q",
            "foxhunt_compiled",
            "foxhunt_bf16",
            "sb3",
            "torch_minimal",
            "gemm_floor",
            "foxhunt_cleanrl_update",
            "cleanrl",
        }
        _positive(med)
        for name, reps in r["updates_per_s_reps"].items():
            assert len(reps) == r["reps"] == 2
            assert med[name] == pytest.approx(sorted(reps)[0] / 2 + sorted(reps)[1] / 2)
        assert r["ratio_foxhunt_vs_sb3"] == pytest.approx(med["foxhunt"] / med["sb3"])
        assert out["ratios"][f"foxhunt_vs_sb3_updates_per_s_b{r['batch_size']}"] == pytest.approx(
            r["ratio_foxhunt_vs_sb3"]
        )
        assert r["ratio_foxhunt_compiled_vs_sb3"] == pytest.approx(
            med["foxhunt_compiled"] / med["sb3"]
        )
        assert r["foxhunt_compiled_ran_whole_step_graph"] is True
        assert r["ratio_gemm_floor_vs_sb3"] == pytest.approx(med["gemm_floor"] / med["sb3"])
        assert r["ratio_foxhunt_bf16_vs_sb3"] == pytest.approx(med["foxhunt_bf16"] / med["sb3"])
        assert r["ratio_foxhunt_vs_cleanrl"] == pytest.approx(
            med["foxhunt_cleanrl_update"] / med["cleanrl"]
        )


def test_cnn_learner_smoke(tmp_path: Path) -> None:
    """The Nature-CNN learner step against SB3's CnnPolicy: the same network on both sides."""
    pytest.importorskip("stable_baselines3")
    out = _run("cnn_learner", tmp_path)
    (r,) = out["results"]
    med = r["updates_per_s_median"]
    assert set(med) == {"foxhunt", "foxhunt_compiled", "sb3"}
    _positive(med)
    assert r["parameters"] > 1_000_000  # 3 convolutions + 512 units + the head, both sides
    assert r["foxhunt_compiled_learner_path"] == "whole_step_graph"
    ratio = out["ratios"]["foxhunt_vs_sb3_updates_per_s"]
    assert ratio == pytest.approx(med["foxhunt"] / med["sb3"])


def test_cartpole_time_to_solve_smoke(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    out = _run("cartpole_time_to_solve", tmp_path)
    by_impl = {r["impl"]: r for r in out["results"]}
    assert set(by_impl) == {"foxhunt", "sb3"}
    budget = out["config"]["max_env_steps"]
    for r in by_impl.values():
        assert r["seeds"] == 1 and len(r["runs"]) == 1
        run = r["runs"][0]
        assert run["wall_s_to_solve"] > 0 and run["optimizer_steps"] > 0
        assert 0 < run["env_steps_to_solve"] <= budget
        assert run["censored"] is (not run["solved"])
        # Both sides are evaluated on the same schedule, every eval_every env steps.
        every = out["config"]["eval_every_env_steps"]
        steps = [s for s, _ in run["evals"]]
        assert steps and all(s % every == 0 for s in steps)
        assert steps == sorted(steps)
    ratio = out["ratios"]["foxhunt_vs_sb3_wall_time_to_solve"]
    assert ratio == pytest.approx(
        by_impl["foxhunt"]["median_wall_s_to_solve"] / by_impl["sb3"]["median_wall_s_to_solve"]
    )


def test_clipping_overhead_smoke(tmp_path: Path) -> None:
    out = _run("clipping_overhead", tmp_path)
    for r in out["results"]:
        med = r["ms_per_step_median"]
        assert set(med) == {
            "no_clip",
            "torch_clip",
            "foxhunt_clip",
            "foxhunt_no_clip",
            "two_pass",
            "foxhunt_compiled_clip",
            "foxhunt_compiled_no_clip",
        }
        _positive(med)
        assert r["ratio_vs_no_clip"]["no_clip"] == pytest.approx(1.0)
        assert r["ratio_vs_no_clip"]["two_pass"] == pytest.approx(med["two_pass"] / med["no_clip"])
        # max_grad_norm is far below any gradient norm: foxhunt must have clipped every step.
        assert r["foxhunt_clip_rate"] == r["foxhunt_compiled_clip_rate"] == 1.0
        assert r["foxhunt_compiled_ran_whole_step_graph"] is True
        assert r["ratio_foxhunt_compiled_clip_vs_foxhunt_compiled_no_clip"] == pytest.approx(
            med["foxhunt_compiled_clip"] / med["foxhunt_compiled_no_clip"]
        )


def test_accumulation_memory_smoke(tmp_path: Path) -> None:
    out = _run("accumulation_memory", tmp_path)
    labels = [r["label"] for r in out["results"]]
    assert labels == ["1 x 32", "2 x 32", "1 x 64"]
    for r in out["results"]:
        assert r["network"] == "smoke"
        assert r["effective_batch"] == r["batch"] * r["n_micro"]
        assert r["us_per_sample"] > 0 and r["baseline_rss_mib"] > 0
        assert len(r["us_per_sample_reps"]) == 2  # timing is interleaved: one step per round
        assert r["peak_torch_alloc_mib"] > 0 and r["peak_rss_delta_mib"] > 0
        # obs + next_obs of the sampled effective batch: 2 * rows * 32 floats.
        obs_mib = 2 * r["effective_batch"] * 32 * 4 / 2**20
        assert r["sampled_batch_obs_mib"] == pytest.approx(obs_mib)
        # torch must at least have held the sampled observations and one gradient per parameter.
        assert r["peak_torch_alloc_mib"] >= obs_mib + r["param_mib"]
    ref, acc = out["results"][0], out["results"][1]
    assert ref["peak_torch_ratio_vs_1xb"] == pytest.approx(1.0)
    assert out["ratios"]["smoke_peak_torch_2x32_vs_1x32"] == pytest.approx(
        acc["peak_torch_alloc_mib"] / ref["peak_torch_alloc_mib"]
    )


def test_collection_throughput_smoke(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    out = _run("collection_throughput", tmp_path)
    assert [r["n_envs"] for r in out["results"]] == [1, 4]
    for r in out["results"]:
        med = r["env_steps_per_s_median"]
        assert set(med) == {"foxhunt", "sb3", "env_only_gym_vector", "env_only_sb3_dummyvecenv"}
        _positive(med)
        assert r["env_steps_per_rep"] % r["n_envs"] == 0
        assert r["ratio_foxhunt_vs_sb3"] == pytest.approx(med["foxhunt"] / med["sb3"])


def test_interleaved_rotates_the_starting_contender() -> None:
    import _common

    calls: list[str] = []

    def make(name: str):  # type: ignore[no-untyped-def]
        def fn() -> float:
            calls.append(name)
            return float(len(calls))

        return fn

    out = _common.interleaved({"a": make("a"), "b": make("b"), "c": make("c")}, reps=3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert out == {"a": [1.0, 6.0, 8.0], "b": [2.0, 4.0, 9.0], "c": [3.0, 5.0, 7.0]}
    assert _common.per_rep_ratios([2.0, 9.0], [1.0, 3.0]) == [2.0, 3.0]


def test_write_json_is_atomic_and_replaces(tmp_path: Path) -> None:
    import _common

    path = tmp_path / "sub" / "r.json"
    _common.write_json(path, {"x": 1})
    _common.write_json(path, {"x": 2, "y": [1.5]})
    assert json.loads(path.read_text()) == {"x": 2, "y": [1.5]}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(TypeError):
        _common.write_json(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"x": 2, "y": [1.5]}  # the old file survives
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_md_table_formats_rows() -> None:
    import _common

    table = _common.md_table(["a", "b"], [[1, 0.123456], ["x", 12345.6]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | 0.123 |", "| x | 12346 |"]


@pytest.mark.parametrize("settings", [[], ["--set", "action_augmentation=true"]])
def test_trading_regimes_smoke(tmp_path: Path, settings: list[str]) -> None:
    """The issue-4 benchmark: both agents and the baselines, in its own (row-based) format."""
    module = importlib.import_module("trading_regimes")
    out = tmp_path / "trading_regimes.json"
    returned = module.main(["--smoke", "--out", str(out), *settings])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))
    assert written["benchmark"] == "trading_regimes" and written["smoke"] is True
    assert written["settings"] == ({"action_augmentation": True} if settings else {})
    assert {r["variant"] for r in written["rows"]} == {"regime_conditional", "plain_dqn"}
    for row in written["rows"]:
        for key in (
            "agent_log_return",
            "agent_sharpe",
            "buy_and_hold_log_return",
            "regime_rule_log_return",
        ):
            assert math.isfinite(row[key]), (key, row[key])
        assert row["oracle_log_return"] > 0  # the oracle knows the regimes: it must profit
    # the regime rule depends on the market and the detector only, not on the agent
    assert len({r["regime_rule_log_return"] for r in written["rows"]}) == 1
    assert set(written["mean"]) == {
        "regime_conditional",
        "plain_dqn",
        "buy_and_hold",
        "regime_rule",
    }
    by_variant = {r["variant"]: r["agent_log_return"] for r in written["rows"]}
    pr = written["paired"]
    assert pr["seeds"] == [0]
    assert pr["regime_conditional_minus_plain"] == pytest.approx(
        [by_variant["regime_conditional"] - by_variant["plain_dqn"]]
    )


def test_trading_regimes_one_variant_without_a_regime_model(tmp_path: Path) -> None:
    """`--variants plain_dqn` with one regime state (no regime model): only that agent is
    trained, and there is nothing to pair it with."""
    module = importlib.import_module("trading_regimes")
    out = tmp_path / "r.json"
    module.main(
        ["--smoke", "--out", str(out), "--variants", "plain_dqn", "--set", "market.n_regimes=1"]
    )
    written = json.loads(out.read_text())
    assert [r["variant"] for r in written["rows"]] == ["plain_dqn"]
    assert math.isfinite(written["rows"][0]["agent_log_return"])
    assert written["paired"]["seeds"] == [] and written["paired"]["mean_difference"] is None
    assert "regime_conditional" not in written["mean"]


def test_trading_regimes_pairs_by_market_and_counts_each_market_once() -> None:
    """Over several markets a baseline is each market's figure once (not once per agent row),
    and the agents are paired within a (market, seed)."""
    module = importlib.import_module("trading_regimes")

    def row(market: int, seed: int, variant: str, agent: float) -> dict:
        base = {"buy_and_hold": 0.1 * (market + 1), "regime_rule": 0.5, "oracle": 1.0 + 3 * market}
        return {
            "market_seed": market,
            "seed": seed,
            "variant": variant,
            "agent_log_return": agent,
            "agent_sharpe": agent,
            "oracle_capture": agent / base["oracle"],
            **{f"{k}_log_return": v for k, v in base.items()},
            **{f"{k}_sharpe": v for k, v in base.items() if k != "oracle"},
        }

    rows = [row(0, 0, "regime_conditional", 0.4), row(0, 0, "plain_dqn", 0.1)]
    rows += [
        row(1, s, v, a)
        for s, v, a in [
            (0, "regime_conditional", 0.2),
            (0, "plain_dqn", 0.3),
            (1, "regime_conditional", 0.6),
            (1, "plain_dqn", 0.6),
        ]
    ]
    mean = module.summarise(rows)
    assert mean["buy_and_hold"]["agent_log_return"] == pytest.approx((0.1 + 0.2) / 2)
    # shares of the oracle's total over the markets (1 and 4), not means of per-market shares
    assert mean["buy_and_hold"]["oracle_capture"] == pytest.approx(0.15 / 2.5)
    assert mean["regime_conditional"]["agent_log_return"] == pytest.approx(0.4)
    assert mean["regime_conditional"]["oracle_capture"] == pytest.approx(0.4 / 3.0)
    pr = module.paired(rows)
    assert list(zip(pr["market_seeds"], pr["seeds"], strict=True)) == [(0, 0), (1, 0), (1, 1)]
    assert pr["regime_conditional_minus_plain"] == pytest.approx([0.3, -0.1, 0.0])
    assert pr["regime_conditional_wins"] == 1


def test_classic_control_smoke(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    out = _run("classic_control", tmp_path)
    rows = {(r["env"], r["config"]): r for r in out["results"]}
    assert set(rows) == {
        (env, config)
        for env in ("Acrobot-v1", "MountainCar-v0")
        for config in ("foxhunt classic", "foxhunt default", "sb3 default", "sb3 zoo")
    }
    for row in rows.values():
        run = row["runs"][0]
        assert run["train_wall_s"] > 0 and run["env_steps"] == 600
        assert row["mean_greedy_return"] == run["greedy_return"] <= 0  # rewards are -1 a step
    for env in ("Acrobot-v1", "MountainCar-v0"):
        ratio = out["ratios"][f"{env}_foxhunt_classic_vs_sb3_zoo_wall_time"]
        classic, zoo = rows[(env, "foxhunt classic")], rows[(env, "sb3 zoo")]
        assert ratio == pytest.approx(classic["median_train_wall_s"] / zoo["median_train_wall_s"])


def test_replay_memory_smoke(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    out = _run("replay_memory", tmp_path)
    (r,) = out["results"]
    assert r["foxhunt_obs_dtype"] == "torch.uint8"
    b = r["bytes_per_transition"]
    frame = 4 * 84 * 84
    # Two uint8 frames a transition plus action (8), reward, done and discount (4 each).
    assert b["foxhunt"] == 2 * frame + 8 + 3 * 4
    assert b["float32_obs_storage"] == 2 * frame * 4 + 20
    assert out["ratios"]["foxhunt_vs_sb3_bytes_per_transition"] == b["foxhunt"] / b["sb3"]
    assert set(r["sample_ms_median"]) == {"foxhunt", "sb3", "sb3_float"}


def test_load_ohlcv_smoke(tmp_path: Path) -> None:
    out = _run("load_ohlcv", tmp_path)
    assert [r["layout"] for r in out["results"]] == ["iso", "iso_offset", "epoch_ms"]
    for r in out["results"]:
        assert r["rows"] == 2_000 and len(r["seconds"]["foxhunt"]) == 3
        times = r["seconds"]
        paired = [a / b for a, b in zip(times["foxhunt"], times["pandas"], strict=True)]
        assert r["ratio_paired_median"] == sorted(paired)[1]
        assert out["ratios"][f"foxhunt_vs_pandas_{r['layout']}"] == r["ratio_paired_median"]


def test_trading_sb3_peer_smoke(tmp_path: Path) -> None:
    """SB3's DQN and foxhunt's agent on one TradingEnv, backtested alike (plumbing only)."""
    pytest.importorskip("stable_baselines3")
    out = _run("trading_sb3_peer", tmp_path)
    (r,) = out["results"]
    assert r["seed"] == 0 and r["env_steps"] == 600
    for side in ("sb3", "foxhunt"):
        figures = r[side]
        assert all(math.isfinite(v) for v in figures.values()), figures
        # One market for both: the baselines are the same numbers on both sides.
        for baseline in ("regime_rule", "buy_and_hold", "regime_oracle"):
            assert figures[baseline] == r["sb3"][baseline]
    ratio = out["ratios"]["foxhunt_vs_sb3_wall_time"]
    assert ratio == r["seconds"]["foxhunt"] / r["seconds"]["sb3"]
