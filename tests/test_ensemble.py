"""Q-network ensembles: statistics against hand computations, LCB and fallback policies, member
checks, ensemble run directories (train, reload, evaluate) on a tiny market and on CartPole.

Hand-built members have one hidden ReLU layer with weights set here, so every expected Q-value is
computed independently in NumPy. The trading ensemble is 2 members x 600 steps on a 600-bar market.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from safetensors.numpy import load_file

from foxhunt.config import DQNHyperparameters
from foxhunt.ensemble import QEnsemble, evaluate_ensemble, read_manifest, train_ensemble
from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.learner import DQNAgent
from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv
from foxhunt.runs import build_spec, load_spec, save_model

torch.set_num_threads(1)


def make_agent(
    obs_dim: int = 3, n_actions: int = 2, hidden: int = 2, seed: int = 0, **hp: Any
) -> DQNAgent:
    params: dict[str, Any] = dict(
        hidden_sizes=(hidden,),
        batch_size=8,
        learning_starts=8,
        buffer_capacity=64,
        device="cpu",
        seed=seed,
    )
    params.update(hp)
    space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    return DQNAgent(space, gym.spaces.Discrete(n_actions), DQNHyperparameters(**params))


def set_weights(agent: DQNAgent, w1: Any, b1: Any, w2: Any, b2: Any) -> DQNAgent:
    """Q(x) = relu(x W1^T + b1) W2^T + b2 (a plain, non-dueling net)."""
    names = ("torso.0.weight", "torso.0.bias", "adv_head.weight", "adv_head.bias")
    state = {
        k: torch.as_tensor(np.asarray(v, dtype=np.float32))
        for k, v in zip(names, (w1, b1, w2, b2), strict=True)
    }
    agent.online_net.load_state_dict(state)  # nn.Linear's layout, whatever the storage
    return agent


def constant_member(q: list[float], obs_dim: int = 3) -> DQNAgent:
    """A member whose Q-values are ``q`` for every observation."""
    a = len(q)
    agent = make_agent(obs_dim, a)
    return set_weights(agent, np.zeros((2, obs_dim)), np.zeros(2), np.zeros((a, 2)), q)


def hand_q(x: np.ndarray, w1, b1, w2, b2) -> np.ndarray:
    return np.maximum(x @ w1.T + b1, 0.0) @ w2.T + b2


# --- statistics -----------------------------------------------------------------------------------
def test_mean_and_std_match_a_hand_computation():
    rng = np.random.default_rng(0)
    obs_dim, hidden, n_actions, m = 3, 4, 3, 3
    weights = [
        (
            rng.normal(size=(hidden, obs_dim)),
            rng.normal(size=hidden),
            rng.normal(size=(n_actions, hidden)),
            rng.normal(size=n_actions),
        )
        for _ in range(m)
    ]
    members = [set_weights(make_agent(obs_dim, n_actions, hidden), *w) for w in weights]
    ens = QEnsemble(members)
    x = rng.normal(size=(5, obs_dim)).astype(np.float32)
    q = np.stack([hand_q(x.astype(np.float64), *w) for w in weights])  # [M, B, A]
    mean = q.sum(axis=0) / m
    std = np.sqrt(((q - mean) ** 2).sum(axis=0) / m)  # population std over members
    got_mean, got_std = ens.q_values(x)
    assert got_mean.shape == got_std.shape == (5, n_actions)
    assert got_mean.dtype == got_std.dtype == np.float64
    np.testing.assert_allclose(got_mean, mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_std, std, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ens.member_q_values(x), q, rtol=1e-5, atol=1e-5)
    # One observation is a batch of one; greedy actions are argmax of the mean.
    one_mean, _ = ens.q_values(x[2])
    np.testing.assert_allclose(one_mean, mean[2:3], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ens.greedy_actions(x), mean.argmax(axis=1))
    assert ens.policy()(x[1]) == int(mean[1].argmax())


def test_members_are_evaluated_in_eval_mode_and_their_mode_is_restored():
    noisy = make_agent(3, 2, hidden=4, seed=1, noisy_nets=True)
    net = noisy.online_net
    net.train()
    net.reset_noise(torch.Generator().manual_seed(5))
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        noisy_q = net(x).numpy()
        net.eval()
        mean_weight_q = net(x).numpy()
        net.train()
    assert not np.allclose(noisy_q, mean_weight_q)  # the noise is real
    mean, std = QEnsemble([noisy]).q_values(x.numpy())
    np.testing.assert_allclose(mean, mean_weight_q, rtol=1e-6)
    np.testing.assert_array_equal(std, 0.0)  # one member: no spread, not NaN
    assert net.training


def test_distributional_members_contribute_expected_q_values():
    c51 = make_agent(3, 2, hidden=4, seed=2, distributional="c51", n_atoms=5, v_min=-2, v_max=2)
    plain = make_agent(3, 2, hidden=4, seed=3)
    x = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    with torch.no_grad():
        logits = c51.online_net(torch.from_numpy(x)).double().numpy()  # [B, A, 5]
        q_plain = plain.online_net(torch.from_numpy(x)).double().numpy()
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    q_c51 = (probs * np.linspace(-2, 2, 5)).sum(axis=-1)
    mean, std = QEnsemble([c51, plain]).q_values(x)
    np.testing.assert_allclose(mean, (q_c51 + q_plain) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, np.abs(q_c51 - q_plain) / 2, rtol=1e-5, atol=1e-6)


# --- policies -------------------------------------------------------------------------------------
# Action 0: Q = [2.0, 0.0] -> mean 1.0, std 1.0; action 1: Q = [0.8, 0.8] -> mean 0.8, std 0;
# action 2 (the "flat" fallback): Q = [-1, -1]. The LCB prefers action 1 once 1 - k > 0.8.
RISKY = ([2.0, 0.8, -1.0], [0.0, 0.8, -1.0])


@pytest.mark.parametrize(
    ("risk_aversion", "expected"), [(0.0, 0), (0.1, 0), (0.3, 1), (5.0, 1), (-1.0, 0)]
)
def test_risk_aversion_changes_the_chosen_action(risk_aversion, expected):
    ens = QEnsemble([constant_member(q) for q in RISKY])
    obs = np.zeros((2, 3), np.float32)
    mean, std = ens.q_values(obs)
    np.testing.assert_allclose(mean[0], [1.0, 0.8, -1.0], atol=1e-6)
    np.testing.assert_allclose(std[0], [1.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_array_equal(ens.greedy_actions(obs, risk_aversion=risk_aversion), expected)
    assert ens.policy(risk_aversion=risk_aversion)(obs[0]) == expected


def test_disagreement_counts_members_against_the_ensemble_choice():
    # h = [relu(x0), relu(-x0)]; each member's Q is W2 h, so x0 = +1 and x0 = -1 read W2's columns.
    q_pos = ([1, 0], [1, 0], [1, 0], [0, 2])  # mean [0.75, 0.5] -> 0; member 4 differs: 1/4
    q_neg = ([0, 1], [0, 1], [1, 0], [2, 0])  # mean [0.75, 0.5] -> 0; members 1, 2 differ: 2/4
    w1 = np.array([[1.0, 0, 0], [-1.0, 0, 0]])
    members = [
        set_weights(make_agent(), w1, np.zeros(2), np.array([p, n], float).T, np.zeros(2))
        for p, n in zip(q_pos, q_neg, strict=True)
    ]
    ens = QEnsemble(members)
    obs = np.array([[1, 0, 0], [-1, 5, 5], [0, 1, 1], [2, 0, 0]], np.float32)
    np.testing.assert_allclose(ens.disagreement(obs), [0.25, 0.5, 0.0, 0.25])
    np.testing.assert_array_equal(ens.greedy_actions(obs), [0, 0, 0, 0])
    # Very risk-averse: at x0 = -1 action 1 (Q [1, 1, 0, 0], std 0.5) beats action 0
    # (Q [0, 0, 1, 2], std 0.83): 0.5 - 0.5 k > 0.75 - 0.83 k for k = 2; disagreement is then 2/4.
    assert ens.greedy_actions(obs[1], risk_aversion=2.0)[0] == 1
    np.testing.assert_allclose(ens.disagreement(obs[1], risk_aversion=2.0), [0.5])


def test_disagreement_is_against_the_risk_averse_choice_not_the_mean_greedy_one():
    """Members' own actions [0, 1, 1]: the mean prefers 0, a risk-averse choice 1; members
    disagree with the action taken (1/3), not with the one the mean alone would take (2/3)."""
    members = ([2.5, 0.8, -1.0], [0.25, 0.8, -1.0], [0.25, 0.8, -1.0])
    ens = QEnsemble([constant_member(q) for q in members])
    obs = np.zeros((1, 3), np.float32)
    mean, _ = ens.q_values(obs)
    assert int(mean[0].argmax()) == 0
    decision = ens.decide(obs, risk_aversion=1.0)
    assert decision.chosen[0] == 1
    np.testing.assert_allclose(decision.disagreement, [1 / 3])
    np.testing.assert_allclose(ens.disagreement(obs), [2 / 3])  # risk-neutral: chose 0


def test_fallback_when_the_chosen_actions_std_is_too_high():
    ens = QEnsemble([constant_member(q) for q in RISKY])
    obs = np.zeros(3, np.float32)
    assert ens.policy(fallback_action=2, max_std=0.5)(obs) == 2  # std 1.0 > 0.5: stand aside
    assert ens.policy(fallback_action=2, max_std=1.0)(obs) == 0  # only std > max_std falls back
    assert ens.policy(fallback_action=2)(obs) == 0  # no limit: the fallback never fires
    # Risk aversion first picks the agreed-on action (std 0), so no fallback is needed.
    assert ens.policy(risk_aversion=0.3, fallback_action=2, max_std=0.5)(obs) == 1
    d = ens.decide(np.zeros((2, 3)), fallback_action=2, max_std=0.5)
    np.testing.assert_array_equal(d.actions, [2, 2])
    np.testing.assert_array_equal(d.chosen, [0, 0])
    np.testing.assert_array_equal(d.fell_back, [True, True])
    np.testing.assert_allclose(d.chosen_std, [1.0, 1.0], atol=1e-6)
    # A NaN in the observation leaves the spread undefined: that stands aside too.
    nan_q = np.full((len(RISKY), 1, 3), np.nan)
    ens.member_q_values = lambda obs: nan_q  # type: ignore[method-assign]
    d = ens.decide(obs[None], fallback_action=2, max_std=0.5)
    assert d.fell_back.tolist() == [True] and d.actions.tolist() == [2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_std": 0.5}, "max_std needs a fallback_action"),
        ({"fallback_action": 3, "max_std": 0.5}, r"fallback_action .* 0\.\.2, got: 3"),
        ({"fallback_action": True}, "fallback_action"),
        ({"fallback_action": 2, "max_std": -0.1}, "max_std must be at least 0, got: -0.1"),
        ({"fallback_action": 2, "max_std": float("inf")}, "max_std must be a finite number"),
        ({"risk_aversion": float("nan")}, "risk_aversion must be a finite number, got: nan"),
    ],
)
def test_bad_policy_arguments_are_rejected_up_front(kwargs, match):
    ens = QEnsemble([constant_member(q) for q in RISKY])
    with pytest.raises(ConfigError, match=match):
        ens.policy(**kwargs)


def test_numpy_scalars_are_taken_as_numbers_and_numpy_bools_refused():
    """np.float32 (read from an array) was refused while np.float64, a float subclass, passed."""
    ens = QEnsemble([constant_member(q) for q in RISKY])
    obs = np.zeros((1, 3), np.float32)
    for kind in (np.float32, np.float64, float):
        d = ens.decide(obs, risk_aversion=kind(0.5), fallback_action=2, max_std=kind(0.02))
        assert d.actions.shape == (1,)
    with pytest.raises(ConfigError, match="risk_aversion must be a finite number"):
        ens.policy(risk_aversion=np.bool_(True))  # type: ignore[arg-type]


# --- member checks --------------------------------------------------------------------------------
def test_mismatched_members_are_rejected():
    base = make_agent(3, 2)
    with pytest.raises(ConfigError, match="member-1: obs_dim must equal member-0's 3, got: 4"):
        QEnsemble([base, make_agent(4, 2)])
    with pytest.raises(ConfigError, match="b: n_actions must equal a's 2, got: 3"):
        QEnsemble([base, make_agent(3, 3)], names=["a", "b"])
    space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
    hp = DQNHyperparameters(
        hidden_sizes=(4,), batch_size=8, learning_starts=8, device="cpu", regime_conditional=True
    )
    r2 = DQNAgent(space, gym.spaces.Discrete(2), hp, n_regimes=2)
    r3 = DQNAgent(space, gym.spaces.Discrete(2), hp, n_regimes=3)
    plain6 = make_agent(6, 2)
    QEnsemble([plain6, r2])  # a regime-blind member reads the same observation
    with pytest.raises(ConfigError, match="member-2: n_regimes must equal member-1's 2, got: 3"):
        QEnsemble([plain6, r2, r3])
    with pytest.raises(ConfigError, match="at least one DQNAgent, got: 0"):
        QEnsemble([])
    with pytest.raises(ConfigError, match="member-1 must be a DQNAgent, got: str"):
        QEnsemble([base, "model"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="obs must hold 3 values per observation, got shape"):
        QEnsemble([base]).q_values(np.zeros((2, 4)))


def test_manifest_errors_name_the_file(tmp_path):
    with pytest.raises(FoxhuntError, match=r"no ensemble\.json"):
        QEnsemble.load(tmp_path)
    (tmp_path / "ensemble.json").write_text("{not json")
    with pytest.raises(FoxhuntError, match=r"ensemble\.json is not valid JSON"):
        read_manifest(tmp_path)
    bad = {"format": "foxhunt-ensemble", "format_version": 1, "members": [{"path": "../x"}]}
    (tmp_path / "ensemble.json").write_text(json.dumps(bad))
    with pytest.raises(FoxhuntError, match="member path must lie inside"):
        read_manifest(tmp_path)
    (tmp_path / "ensemble.json").write_text(json.dumps({"format": "other", "format_version": 1}))
    with pytest.raises(FoxhuntError, match="unknown ensemble format 'other'"):
        read_manifest(tmp_path)
    with pytest.raises(FoxhuntError, match=r"is an ensemble: foxhunt\.QEnsemble\.load"):
        QEnsemble.from_run_dirs([tmp_path])  # a member given as the ensemble's own directory


# --- a trained trading ensemble -------------------------------------------------------------------
TINY = {
    "hidden_sizes": [8],
    "batch_size": 16,
    "learning_starts": 64,
    "buffer_capacity": 1000,
    "train_freq": 4,
    "eval_interval": 0,
    "log_interval": 300,
    "device": "cpu",
    "seed": 11,
}


MEMBERS = ("member-0", "member-1")


@pytest.fixture(scope="module")
def trading_ensemble(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ens")
    data = write_synthetic_csv(root / "m.csv", SyntheticMarketConfig(n_bars=600), seed=3)
    spec = build_spec(
        data=str(data),
        preset_name="default",
        overrides={**TINY, "market.detector": "volatility_trend"},
        total_steps=600,
    )
    paths = train_ensemble(spec, root / "run", 2)
    assert paths == [root / "run" / "member-0", root / "run" / "member-1"]
    return root / "run"


def test_train_ensemble_writes_members_and_a_manifest(trading_ensemble):
    run = trading_ensemble
    from foxhunt.ensemble import member_seed

    manifest = json.loads((run / "ensemble.json").read_text())
    seeds = [11, member_seed(11, 1)]
    assert manifest["members"] == [
        {"path": "member-0", "seed": 11},
        {"path": "member-1", "seed": seeds[1]},
    ]
    assert load_spec(run).hyperparameters.seed == 11
    for i in range(2):
        member_cfg = yaml.safe_load((run / f"member-{i}" / "config.yaml").read_text())
        assert member_cfg["hyperparameters"]["seed"] == seeds[i]
        assert (run / f"member-{i}" / "model.safetensors").is_file()
        # One regime model for every member: the one ensemble evaluate builds for all of them.
        assert member_cfg["market"]["detector_seed"] == 11
    detectors = [json.loads((run / m / "data.json").read_text())["detector"] for m in MEMBERS]
    assert detectors[0] == detectors[1] == json.loads((run / "data.json").read_text())["detector"]
    # Seeds far apart: seed + i shared environment streams (sub-env j is seeded seed + j), so
    # adjacent members stepped 3 of their 4 envs through the same episodes.
    drawn = [member_seed(11, i) for i in range(1, 50)]
    assert len(set(drawn)) == 49 and all(abs(d - 11) > 4096 for d in drawn)
    assert member_seed(11, 1) == member_seed(11, 1) != member_seed(12, 1)
    assert not list(run.glob(".*.tmp"))


def test_members_read_the_ensembles_regime_model() -> None:
    """Each trading member fitted its own HMM from its own seed and was then judged on member
    0's: members keep the ensemble's detector seed (as hyperopt's trials keep the search's)."""
    from foxhunt.ensemble import member_seed, member_spec

    spec = build_spec(overrides={"seed": 5})
    members = [member_spec(spec, member_seed(5, i)) for i in range(3)]
    assert [m.hyperparameters.seed for m in members] == [member_seed(5, i) for i in range(3)]
    assert {m.market.detector_seed for m in members} == {5}
    assert {m.market.model_copy(update={"detector_seed": None}) for m in members} == {spec.market}
    chosen = build_spec(overrides={"seed": 5, "market.detector_seed": 9})
    assert member_spec(chosen, 123).market.detector_seed == 9  # a seed the user chose stays
    gym = build_spec(env="CartPole-v1", overrides={"seed": 5})
    assert member_spec(gym, 123).market == gym.market  # no market to read


def test_from_run_dirs_round_trip(trading_ensemble):
    run = trading_ensemble
    dirs = [run / "member-0", run / "member-1"]
    ens = QEnsemble.from_run_dirs(dirs)
    assert ens.names == [str(d) for d in dirs]
    assert QEnsemble.load(run).names == ["member-0", "member-1"]
    x = np.random.default_rng(2).normal(size=(16, ens.obs_dim)).astype(np.float32)
    # Each member's Q from its saved tensors, by hand (plain MLP: one hidden ReLU layer).
    q = []
    for d in dirs:
        t = {k: v.astype(np.float64) for k, v in load_file(str(d / "model.safetensors")).items()}
        q.append(
            hand_q(
                x, t["torso.0.weight"], t["torso.0.bias"], t["adv_head.weight"], t["adv_head.bias"]
            )
        )
    q = np.stack(q)
    mean, std = ens.q_values(x)
    np.testing.assert_allclose(mean, q.mean(axis=0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(std, np.abs(q[0] - q[1]) / 2, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(QEnsemble.load(run).q_values(x)[0], mean)
    assert (std > 0).all()  # different seeds give different members


def test_evaluate_ensemble_writes_the_backtest_report(trading_ensemble, monkeypatch):
    import foxhunt.runs

    run = trading_ensemble
    built = []
    real_build = foxhunt.runs.build_trading
    monkeypatch.setattr(
        foxhunt.runs, "build_trading", lambda *a, **k: built.append(1) or real_build(*a, **k)
    )
    out = evaluate_ensemble(run, split="test", risk_aversion=0.5)
    assert len(built) == 1  # the market (and its detector) is built once, not per consumer
    # Members are annualised like the ensemble and the baselines: one bars-per-year figure.
    assert {m["periods_per_year"] for m in out["members"].values()} == {out["periods_per_year"]}
    assert out["metrics"]["buy & hold"]["periods_per_year"] == out["periods_per_year"]
    for name in ("report.html", "report.md", "metrics.json", "equity.png", "ensemble.json"):
        assert (run / "backtest" / name).is_file(), name
    saved = json.loads((run / "backtest" / "ensemble.json").read_text())
    assert saved["ensemble"] == out["ensemble"]
    report = json.loads((run / "backtest" / "metrics.json").read_text())
    assert {"agent", "buy & hold", "flat"} <= set(report["results"])
    assert set(out["members"]) == {"member-0", "member-1"}
    # Members trade the ensemble's periods, on a split that closes on the next one's first bar
    # too (they had one period fewer there).
    val = evaluate_ensemble(run, split="validation")
    assert {m["bars"] for m in val["members"].values()} == {val["metrics"]["agent"]["bars"]}
    e = out["ensemble"]
    assert e["decisions"] > 0 and e["fallback_action"] is None  # no max_std: no fallback
    assert 0.0 <= e["mean_disagreement"] <= 1.0
    assert e["mean_chosen_std"] > 0.0 and e["max_chosen_std"] >= e["mean_chosen_std"]
    assert e["fallback_rate"] == 0.0  # no max_std: never stands aside

    # max_std = 0 stands aside whenever members differ at all (always, here): the agent is flat.
    aside = evaluate_ensemble(run, split="test", max_std=0.0)
    assert aside["ensemble"]["fallback_rate"] == 1.0
    assert aside["ensemble"]["fallback_action"] == 1  # (-1, 0, 1): index 1 is flat
    agent, flat = aside["metrics"]["agent"], aside["metrics"]["flat"]
    assert agent["exposure"] == 0.0
    assert agent["total_return"] == pytest.approx(flat["total_return"], abs=1e-12)


def test_ensemble_evaluate_names_the_flags_a_user_typed(trading_ensemble):
    from argparse import Namespace

    from foxhunt.cli import cmd_ensemble

    args = Namespace(
        ensemble_command="evaluate",
        run_dir=str(trading_ensemble),
        split="test",
        risk_aversion=0.0,
        max_std=0.5,
        fallback_action=7,
        data=None,
        episodes=None,
    )
    with pytest.raises(ConfigError, match=r"^--fallback-action must be an action index in 0\.\.2"):
        cmd_ensemble(args)
    args.max_std = None
    with pytest.raises(ConfigError, match=r"^--fallback-action is taken only where .* --max-std"):
        cmd_ensemble(args)


def test_an_ensemble_stopped_part_way_resumes_to_the_uninterrupted_one(
    tmp_path, trading_ensemble, monkeypatch
):
    """Ctrl-C in member 1 (member 0 trained): `ensemble resume` keeps member 0, resumes member 1
    from its checkpoint, and writes the ensemble an uninterrupted run writes, bit for bit."""
    import signal

    from foxhunt.ensemble import PLAN_FILE, member_seed, resume_ensemble
    from foxhunt.trainer import DQNTrainer, TrainingInterrupted

    spec = load_spec(trading_ensemble)
    collect = DQNTrainer.collect_step

    def interrupt_member_1(self: DQNTrainer) -> None:
        collect(self)
        if self.hp.seed == member_seed(11, 1) and self.env_steps == 300:
            self._interrupt_requested = signal.SIGINT  # as the Ctrl-C handler sets it

    monkeypatch.setattr(DQNTrainer, "collect_step", interrupt_member_1)
    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train_ensemble(spec, run, 2)
    monkeypatch.setattr(DQNTrainer, "collect_step", collect)
    assert (run / PLAN_FILE).is_file() and not (run / "ensemble.json").exists()
    assert not (run / "member-1" / "model.safetensors").exists()
    with pytest.raises(ConfigError, match="is an ensemble stopped part way"):
        from foxhunt.cli import cmd_resume

        cmd_resume(type("Args", (), {"run_dir": str(run), "total_steps": None})())
    plan = (run / PLAN_FILE).read_text()
    assert json.loads(plan) == {"members": 2, "seeds": [11, member_seed(11, 1)]}
    (run / PLAN_FILE).write_text('{"members": 2, "seeds": [11, -3]}')
    with pytest.raises(FoxhuntError, match=r"seeds must be 2 integers in \[0, 2\*\*32\)"):
        resume_ensemble(run)
    (run / PLAN_FILE).write_text('{"members": 2, "seeds": [11, 11]}')  # one model twice
    with pytest.raises(FoxhuntError, match=r"seeds must differ, got: \[11, 11\]"):
        resume_ensemble(run)
    (run / PLAN_FILE).write_text(plan)
    np.random.seed(5)
    expected = np.random.random()
    np.random.seed(5)
    assert resume_ensemble(run) == [run / "member-0", run / "member-1"]
    assert np.random.random() == expected  # the caller's global RNG as it was (members seed it)
    assert not (run / PLAN_FILE).exists()
    assert (run / "ensemble.json").read_text() == (trading_ensemble / "ensemble.json").read_text()
    for member in ("member-0", "member-1"):
        done, reference = (
            load_file(str(d / member / "model.safetensors")) for d in (run, trading_ensemble)
        )
        assert done.keys() == reference.keys()
        assert all(np.array_equal(done[k], reference[k]) for k in done)
    with pytest.raises(FoxhuntError, match="is a complete ensemble: nothing to resume"):
        resume_ensemble(run)


def test_ensemble_resume_never_deletes_a_member_still_training(tmp_path, trading_ensemble):
    """A member with no checkpoint yet is started again from scratch, but not while the
    ensemble that is training it holds it: resume is refused, the member untouched."""
    import shutil

    from foxhunt.ensemble import PLAN_FILE, resume_ensemble
    from foxhunt.session import run_lock

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(trading_ensemble / "member-0" / "config.yaml", tmp_path / "config.yaml")
    (run / PLAN_FILE).write_text('{"members": 2}\n')
    live = run / "member-0"
    live.mkdir()
    shutil.copy(tmp_path / "config.yaml", live / "config.yaml")
    (live / "metrics.csv").write_text("env_steps\n")
    in_use = pytest.raises(FoxhuntError, match="member-0 is in use by another foxhunt process")
    with run_lock(live), in_use:  # as the training process holds it
        resume_ensemble(run)
    assert (live / "metrics.csv").is_file()


def test_an_ensemble_on_a_bad_market_file_writes_nothing(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2\n")
    spec = build_spec(data=str(bad), preset_name="default", overrides=TINY, total_steps=600)
    with pytest.raises(FoxhuntError, match="missing column"):
        train_ensemble(spec, tmp_path / "run", 2)
    assert not (tmp_path / "run").exists()


def test_train_ensemble_rejects_bad_inputs(tmp_path, trading_ensemble):
    spec = load_spec(trading_ensemble)
    with pytest.raises(ConfigError, match="n_members must be an integer of at least 2, got: 1"):
        train_ensemble(spec, tmp_path / "new", 1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConfigError, match="run_dir must be a new or empty directory"):
        train_ensemble(spec, tmp_path / "full", 2)
    with pytest.raises(ConfigError, match="split must be one of"):
        evaluate_ensemble(trading_ensemble, split="future")
    assert not (tmp_path / "new").exists()


# --- a Gymnasium ensemble -------------------------------------------------------------------------
def balancer(right_bias: float = 0.0) -> DQNAgent:
    """CartPole member: push right iff theta + theta_dot > 0 (Q = [relu(-s), relu(s)] + bias)."""
    w1 = np.array([[0, 0, 1.0, 1.0], [0, 0, -1.0, -1.0]])
    w2 = np.array([[0, 1.0], [1.0, 0]])
    return set_weights(make_agent(4, 2), w1, np.zeros(2), w2, [0.0, right_bias])


def hand_returns(policy, episodes: int, seed: int = 11) -> list[float]:
    """Episode returns of ``policy(obs) -> action`` with evaluate's episode seeds."""
    env = gym.make("CartPole-v1")
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + 2_000_003 + k)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(policy(obs))
            total += float(r)
            done = term or trunc
        returns.append(total)
    return returns


def write_ensemble_dir(root: Path, agents: list[DQNAgent], env: str = "CartPole-v1") -> Path:
    spec = build_spec(env=env, overrides={**TINY, "hidden_sizes": [2]}, total_steps=100)
    for i, agent in enumerate(agents):
        save_model(root / f"member-{i}", agent)
    (root / "config.yaml").write_text(spec.to_yaml())
    members = [{"path": f"member-{i}", "seed": i} for i in range(len(agents))]
    manifest = {"format": "foxhunt-ensemble", "format_version": 1, "members": members}
    (root / "ensemble.json").write_text(json.dumps(manifest))
    return root


def test_evaluate_gym_ensemble_matches_the_hand_policy(tmp_path):
    run = write_ensemble_dir(tmp_path, [balancer(), balancer()])
    out = evaluate_ensemble(run, episodes=3)
    returns = hand_returns(lambda obs: int(obs[2] + obs[3] > 0), 3)
    assert out["mean_return"] == pytest.approx(np.mean(returns))
    assert out["mean_return"] > 100  # the hand-set members really balance the pole
    assert out["ensemble"]["mean_disagreement"] == 0.0 and out["ensemble"]["mean_chosen_std"] == 0
    assert json.loads((run / "evaluation.json").read_text()) == out
    with pytest.raises(ConfigError, match="max_std needs a fallback_action"):
        evaluate_ensemble(run, episodes=1, max_std=0.1)
    with pytest.raises(ConfigError, match="fallback_action is taken only where the members"):
        evaluate_ensemble(run, episodes=1, fallback_action=0)  # it could never apply


def test_gym_fallback_replaces_uncertain_actions(tmp_path):
    # The second member adds 0.5 to "right": right always has std 0.25, left std 0. With
    # max_std 0.1 and fallback "left", every right push is replaced: the ensemble always goes left.
    run = write_ensemble_dir(tmp_path, [balancer(), balancer(right_bias=0.5)])
    out = evaluate_ensemble(run, episodes=2, max_std=0.1, fallback_action=0)
    assert out["mean_return"] == pytest.approx(np.mean(hand_returns(lambda obs: 0, 2)))
    e = out["ensemble"]
    assert e["fallback_rate"] > 0.0
    assert e["max_chosen_std"] == pytest.approx(0.25, abs=1e-6)
    without = evaluate_ensemble(run, episodes=2)
    assert without["mean_return"] > out["mean_return"]


def test_cli_evaluate_refuses_model_on_an_ensemble(trading_ensemble, capsys):
    from foxhunt.cli import main

    assert main(["evaluate", str(trading_ensemble), "--model", "best"]) == 2
    assert "--model applies to single runs" in capsys.readouterr().err


def test_members_trained_on_different_data_are_refused(tmp_path: Path) -> None:
    import json

    from foxhunt.ensemble import _check_same_data
    from foxhunt.errors import DataError

    record = {
        "format": "foxhunt-data",
        "rows": 600,
        "first": "2020-01-01",
        "last": "2021-08-22",
        "sha256": "a" * 64,
        "index_sha256": "b" * 64,
        "train_end": 420,
        "val_end": 510,
    }
    members = [tmp_path / f"member-{k}" for k in range(3)]
    for m in members:
        m.mkdir()
        (m / "data.json").write_text(json.dumps(record))
    _check_same_data(members)  # the same market: accepted
    (members[2] / "data.json").write_text(json.dumps({**record, "sha256": "c" * 64}))
    with pytest.raises(DataError, match="member-0 and member-2 trained on different data"):
        _check_same_data(members)


def test_ensemble_resume_refuses_changed_data_before_training(
    trading_ensemble, tmp_path: Path
) -> None:
    import shutil

    from foxhunt.ensemble import PLAN_FILE, resume_ensemble
    from foxhunt.errors import DataError

    run = tmp_path / "run"
    shutil.copytree(trading_ensemble, run)
    data = Path(load_spec(run).market.data)
    original = data.read_text()
    shutil.rmtree(run / "member-1")  # as if stopped before member 1 started
    (run / "ensemble.json").unlink()
    (run / PLAN_FILE).write_text('{"members": 2}')
    lines = original.splitlines(keepends=True)
    try:
        data.write_text("".join(lines[:-50]))  # the file changed since member 0 trained
        with pytest.raises(DataError, match="has changed since the run trained"):
            resume_ensemble(run)
        assert not (run / "member-1").exists()  # refused before anything trained
    finally:
        data.write_text(original)


def test_one_run_counted_twice_is_refused_and_identical_members_are_named(tmp_path, caplog):
    """Copies of one model agree by construction: every std 0, read as certainty."""
    run = write_ensemble_dir(tmp_path / "ens", [balancer(), balancer(0.5)])
    with pytest.raises(FoxhuntError, match="paths list the same run twice"):
        QEnsemble.from_run_dirs([run / "member-0", run / "member-1", run / "member-0"])
    manifest = json.loads((run / "ensemble.json").read_text())
    manifest["members"].append({"path": "./member-1", "seed": 2})
    (run / "ensemble.json").write_text(json.dumps(manifest))
    with pytest.raises(FoxhuntError, match=r"members list the same run twice: 'member-1' and "):
        QEnsemble.load(run)  # each named as written (the second is ./member-1)
    with caplog.at_level(logging.WARNING, logger="foxhunt.ensemble"):
        QEnsemble.from_run_dirs([run / "member-0", run / "member-1"])
        assert "identical weights" not in caplog.text
        copy = tmp_path / "copy"
        shutil.copytree(run / "member-1", copy)
        QEnsemble.from_run_dirs([run / "member-0", run / "member-1", copy])
    assert f"members {run / 'member-1'} and {copy} hold identical weights" in caplog.text


def test_ensemble_evaluate_says_when_config_yaml_no_longer_fits_the_members(tmp_path):
    run = write_ensemble_dir(tmp_path, [balancer(), balancer(0.5)])
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("CartPole-v1", "Acrobot-v1"))
    with pytest.raises(ConfigError) as err:
        evaluate_ensemble(run, episodes=1)
    message = str(err.value)
    assert "\n" not in message and f"{run / 'member-0'}: the model (model.json)" in message
    assert "was config.yaml changed after training?" in message


def test_next_position_acts_with_an_ensemble(trading_ensemble, tmp_path):
    """An ensemble of two copies of member 0 decides as member 0 alone, with no spread; the
    real ensemble falls back to flat where its spread exceeds max_std."""
    import foxhunt

    twins = tmp_path / "twins"
    shutil.copytree(trading_ensemble, twins)
    shutil.rmtree(twins / "member-1")
    shutil.copytree(twins / "member-0", twins / "member-1")
    for held in (None, -1.0, 0.0, 1.0):
        alone = foxhunt.next_position(trading_ensemble / "member-0", held=held)
        pair = foxhunt.next_position(twins, held=held)
        assert {k: pair[k] for k in alone} == alone
        assert pair["ensemble"]["chosen_std"] == 0.0 and pair["ensemble"]["disagreement"] == 0.0
    # A limit of 0 is exceeded by any spread: the flat position (of short / flat / long).
    out = foxhunt.next_position(trading_ensemble, held=1.0, max_std=0.0)
    assert out["ensemble"]["chosen_std"] > 0.0 and out["ensemble"]["fell_back"]
    assert out["position"] == 0.0 and out["ensemble"]["fallback_action"] == 1
    with pytest.raises(ConfigError, match="model applies to one run"):
        foxhunt.next_position(trading_ensemble, model="best")
    with pytest.raises(ConfigError, match=r"fallback_action applies to ensembles.*=0"):
        foxhunt.next_position(trading_ensemble / "member-0", fallback_action=0)
    with pytest.raises(ConfigError, match=r"risk_aversion, max_std apply to ensembles"):
        foxhunt.next_position(trading_ensemble / "member-0", risk_aversion=1.0, max_std=0.1)
    for odd in (False, np.array([0.0, 1.0])):  # not numbers: refused, never compared
        with pytest.raises(ConfigError, match=r"risk_aversion applies to ensembles"):
            foxhunt.next_position(trading_ensemble / "member-0", risk_aversion=odd)
    # As ensemble evaluate: a fallback without a limit would never be taken.
    with pytest.raises(ConfigError, match=r"give max_std too, got fallback_action=2"):
        foxhunt.next_position(trading_ensemble, fallback_action=2)


def test_the_default_fallback_is_the_one_position_nearest_flat() -> None:
    from foxhunt.ensemble import flat_action

    assert flat_action([-1.0, 0.0, 1.0], 0.1) == 1
    assert flat_action([0.5, 1.0], 0.1) == 0  # long-only without flat: the least exposure
    assert flat_action([-1.0, 1.0], None) is None  # no limit, no fallback
    with pytest.raises(ConfigError, match=r"positions \[-1.0, 1.0\] have no one position"):
        flat_action([-1.0, 1.0], 0.1)  # short or long: the user's choice


def test_python_calls_on_an_ensemble_or_search_directory_name_the_call_that_takes_it(
    trading_ensemble: Path, tmp_path: Path
) -> None:
    """The CLI dispatches these; from Python they said "no trained model" or "no checkpoint",
    pointing the user the wrong way."""
    import foxhunt
    from foxhunt.runs import load_model

    for call, needle in (
        (lambda d: foxhunt.evaluate_run(d), "foxhunt.evaluate_ensemble"),
        (lambda d: load_model(d), "foxhunt.QEnsemble.load"),
        (lambda d: foxhunt.resume_run(d, verbose=False), "foxhunt.resume_ensemble"),
    ):
        with pytest.raises(ConfigError, match=rf"is an ensemble: {needle}"):
            call(trading_ensemble)
    search = tmp_path / "search"
    search.mkdir()
    (search / "study.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"hyperparameter search's results, not a run"):
        foxhunt.evaluate_run(search)


@pytest.mark.parametrize("wrong", [DQNHyperparameters(), "CartPole-v1", {"env": "CartPole-v1"}])
def test_entry_points_refuse_a_spec_that_is_not_a_runspec_by_name(wrong: Any, tmp_path) -> None:
    """An SB3 user passes the hyperparameters; it failed deep inside with an AttributeError."""
    import foxhunt

    for call in (
        lambda: foxhunt.train_run(wrong, tmp_path / "a", verbose=False),
        lambda: train_ensemble(wrong, tmp_path / "b", n_members=2, verbose=False),
        lambda: foxhunt.run_hyperopt(wrong, run_dir=tmp_path / "c", n_trials=1),
    ):
        with pytest.raises(
            ConfigError, match=rf"spec must be a RunSpec, got: {type(wrong).__name__}"
        ):
            call()
    assert not any(tmp_path.iterdir())


def test_next_position_on_an_ensemble_reports_plain_numbers(trading_ensemble: Path) -> None:
    """NumPy scalars are accepted as settings; the decision echoed them back unconverted, and
    json.dumps of it failed."""
    import foxhunt

    out = foxhunt.next_position(
        trading_ensemble,
        risk_aversion=np.float32(0.5),
        max_std=np.float64(1.0),
        fallback_action=np.int64(1),
    )
    settings = out["ensemble"]
    assert type(settings["risk_aversion"]) is float and type(settings["max_std"]) is float
    assert type(settings["fallback_action"]) is int
    assert json.loads(json.dumps(out)) == out
