"""The optimization step: one backward per micro-batch, single-pass clipping, one optimizer and
scheduler step per window, non-finite skips, target sync and LR schedules in optimizer steps."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from foxhunt.batch import Batch, split_sizes
from foxhunt.config import DQNHyperparameters
from foxhunt.errors import ConfigError
from foxhunt.learner import DQNAgent, resolve_device
from foxhunt.trainer import DQNTrainer


def _flat(ts) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in ts])


def _snapshot(agent: DQNAgent) -> list[torch.Tensor]:
    return [p.detach().clone() for p in agent.params]


class BackwardCounter:
    """Counts backward passes: one gradient hook per parameter plus a wrap of autograd.backward."""

    def __init__(self, agent: DQNAgent, monkeypatch: pytest.MonkeyPatch) -> None:
        self.per_param = [0] * len(agent.params)
        self.calls = 0
        for i, p in enumerate(agent.params):
            p.register_hook(self._hook(i))
        original = torch.autograd.backward

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(torch.autograd, "backward", counting)

    def _hook(self, i: int):  # type: ignore[no-untyped-def]
        def hook(grad: torch.Tensor) -> None:
            self.per_param[i] += 1

        return hook


# --- backward passes and clipping ---------------------------------------------------------------
@pytest.mark.parametrize("n_micro", [1, 3, 4])
def test_one_backward_per_micro_batch_even_when_clipping(
    n_micro: int, hp_factory, agent_factory, batch_factory, monkeypatch
) -> None:
    hp = hp_factory(
        max_grad_norm=1e-3, dueling=True, batch_size=16, gradient_accumulation_steps=n_micro
    )
    agent = agent_factory(hp)
    counter = BackwardCounter(agent, monkeypatch)
    batch = batch_factory(16 * n_micro)
    for mb in batch.split([16] * n_micro):
        agent.backward_only(mb, 1 / n_micro)
    assert counter.calls == n_micro
    assert counter.per_param == [n_micro] * len(agent.params)
    stats = agent.optimizer_step()
    assert stats.clipped
    assert counter.calls == n_micro  # no backward inside optimizer_step
    assert counter.per_param == [n_micro] * len(agent.params)


def test_clipping_fires_norms_and_applied_update(hp_factory, agent_factory, batch_factory) -> None:
    max_norm = 0.01
    hp = hp_factory(optimizer="sgd", learning_rate=1.0, momentum=0.0, max_grad_norm=max_norm)
    agent = agent_factory(hp)
    for mb in batch_factory(128, reward_scale=5.0).split([64, 64]):
        agent.backward_only(mb, 0.5)
    grads = [p.grad.detach().clone() for p in agent.params]
    pre = torch.linalg.vector_norm(_flat(grads)).item()
    assert pre > 5 * max_norm
    before = _snapshot(agent)
    stats = agent.optimizer_step()
    assert stats.pre_clip_norm == pytest.approx(pre, rel=1e-5)
    assert stats.clipped
    assert stats.post_clip_norm == pytest.approx(max_norm, rel=1e-5)
    # With SGD, lr = 1 and no momentum the parameter change is exactly -(clipped gradient).
    delta = _flat(p for p in agent.params) - _flat(before)
    assert torch.linalg.vector_norm(delta).item() == pytest.approx(max_norm, rel=1e-5)
    torch.testing.assert_close(delta, -_flat(grads) * (max_norm / pre), rtol=1e-4, atol=1e-7)
    assert all(p.grad is None for p in agent.params)


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd", "rmsprop"])
def test_clipped_step_matches_clip_grad_norm_then_step(
    name: str, hp_factory, agent_factory, batch_factory
) -> None:
    """Every optimizer (fused kernels, the direct fused Adam step, foreach) lands where
    clip_grad_norm_ + a for-loop optimizer lands."""
    max_norm = 0.05
    hp = hp_factory(optimizer=name, learning_rate=1e-2, momentum=0.9, max_grad_norm=max_norm)
    agent = agent_factory(hp)
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in agent.params]
    kwargs: dict[str, Any] = dict(lr=1e-2, foreach=False, weight_decay=0.0)
    ref_opt = {
        "adam": lambda: torch.optim.Adam(ref_params, eps=hp.adam_eps, **kwargs),
        "adamw": lambda: torch.optim.AdamW(ref_params, eps=hp.adam_eps, **kwargs),
        "sgd": lambda: torch.optim.SGD(ref_params, momentum=0.9, **kwargs),
        "rmsprop": lambda: torch.optim.RMSprop(ref_params, eps=hp.adam_eps, momentum=0.9, **kwargs),
    }[name]()
    for step in range(3):
        for mb in batch_factory(64, seed=step, reward_scale=5.0).split([32, 32]):
            agent.backward_only(mb, 0.5)
        for ref, p in zip(ref_params, agent.params, strict=True):
            ref.grad = p.grad.detach().clone()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref_params, max_norm)
        ref_opt.step()
        stats = agent.optimizer_step()
        assert stats.clipped and stats.pre_clip_norm == pytest.approx(float(ref_norm), rel=1e-5)
        torch.testing.assert_close(_flat(agent.params), _flat(ref_params), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_direct_fused_adam_step_is_bitwise_optimizer_step(
    name: str, hp_factory, agent_factory, batch_factory, monkeypatch
) -> None:
    """The direct kernel call lands bit for bit where Optimizer.step lands, under a warmup+cosine
    schedule, weight decay and clipping, and keeps doing so after a state dict is loaded."""
    hp = hp_factory(
        optimizer=name,
        learning_rate=1e-2,
        weight_decay=0.01,
        max_grad_norm=0.5,
        lr_schedule="cosine",
        lr_warmup_steps=2,
        lr_decay_steps=5,
        lr_final_ratio=0.1,
    )
    fast, slow = agent_factory(hp), agent_factory(hp)
    slow._fast_adam = False
    calls: dict[int, int] = {}

    def count_steps(agent: DQNAgent) -> None:
        calls[id(agent)] = 0
        step = agent.optimizer.step

        def counting_step(*args: Any, **kwargs: Any) -> Any:
            calls[id(agent)] += 1
            return step(*args, **kwargs)

        monkeypatch.setattr(agent.optimizer, "step", counting_step)

    count_steps(fast)
    count_steps(slow)

    def run(agent: DQNAgent, seeds: range) -> None:
        for seed in seeds:
            agent.backward_only(batch_factory(32, seed=seed, reward_scale=5.0))
            agent.optimizer_step()

    run(fast, range(4))
    run(slow, range(4))
    assert calls == {id(fast): 1, id(slow): 4}  # only the fast agent's first step went via step()
    assert torch.equal(_flat(fast.params), _flat(slow.params))
    # A resumed agent: its optimizer state tensors are new objects, read fresh by the fast path.
    resumed = agent_factory(hp)
    resumed.online_net.load_state_dict(fast.online_net.state_dict())
    resumed.optimizer.load_state_dict(fast.optimizer.state_dict())
    resumed.scheduler.load_state_dict(fast.scheduler.state_dict())
    count_steps(resumed)
    run(resumed, range(4, 8))
    run(slow, range(4, 8))
    assert calls[id(resumed)] == 0
    assert torch.equal(_flat(resumed.params), _flat(slow.params))
    for p_r, p_s in zip(resumed.params, slow.params, strict=True):
        st_r, st_s = resumed.optimizer.state[p_r], slow.optimizer.state[p_s]
        assert all(torch.equal(st_r[k], st_s[k]) for k in ("exp_avg", "exp_avg_sq", "step"))


def test_optimizer_hooks_still_run_every_step(hp_factory, agent_factory, batch_factory) -> None:
    """A user's step hooks (per optimizer or global) run on every step: with hooks registered the
    step goes through Optimizer.step, not the direct kernel call."""
    agent = agent_factory(hp_factory(optimizer="adam"))
    seen: list[str] = []
    agent.optimizer.register_step_post_hook(lambda *_: seen.append("own"))
    handle = register_optimizer_step_pre_hook(lambda *_: seen.append("global"))
    try:
        for seed in range(3):
            agent.backward_only(batch_factory(16, seed=seed))
            agent.optimizer_step()
    finally:
        handle.remove()
    assert seen == ["global", "own"] * 3


@pytest.mark.parametrize("max_norm", [1e6, None])
def test_no_clipping_leaves_gradients_untouched(
    max_norm: float | None, hp_factory, agent_factory, batch_factory
) -> None:
    hp = hp_factory(optimizer="sgd", learning_rate=1.0, momentum=0.0, max_grad_norm=max_norm)
    agent = agent_factory(hp)
    agent.backward_only(batch_factory(64), 1.0)
    grads = _flat(p.grad for p in agent.params)
    before = _flat(agent.params)
    stats = agent.optimizer_step()
    assert not stats.clipped
    assert stats.pre_clip_norm == pytest.approx(torch.linalg.vector_norm(grads).item(), rel=1e-5)
    assert stats.post_clip_norm == stats.pre_clip_norm
    torch.testing.assert_close(_flat(agent.params) - before, -grads, rtol=1e-4, atol=1e-7)


# --- one optimizer / scheduler step per window --------------------------------------------------
@pytest.mark.parametrize("accum", [1, 2, 4])
def test_one_optimizer_and_scheduler_step_per_window(
    accum: int, hp_factory, agent_factory, batch_factory
) -> None:
    hp = hp_factory(
        batch_size=8, gradient_accumulation_steps=accum, lr_schedule="linear", lr_decay_steps=10
    )
    agent = agent_factory(hp)
    for window in range(1, 4):
        batch = batch_factory(8 * accum, seed=window)
        for mb in batch.split([8] * accum):
            agent.backward_only(mb, 1 / accum)
            assert all(p.grad is not None for p in agent.params)
        agent.optimizer_step()
        assert agent.optimizer_steps == window
        assert agent.scheduler.last_epoch == window
        for p in agent.params:
            assert int(agent.optimizer.state[p]["step"]) == window
            assert p.grad is None


@pytest.mark.parametrize("accum", [1, 2, 4])
def test_trainer_train_step_takes_exactly_one_step(accum: int, hp_factory) -> None:
    hp = hp_factory(
        batch_size=8,
        gradient_accumulation_steps=accum,
        learning_starts=32,
        train_freq=1000,
        eval_interval=0,
        buffer_capacity=256,
    )
    trainer = DQNTrainer(hp, "CartPole-v1")
    try:
        for _ in range(40):
            trainer.collect_step()
        calls = {"backward": 0}
        agent = trainer.agent
        original = agent.backward_micro_batch

        def counting(*args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
            calls["backward"] += 1
            return original(*args, **kwargs)

        agent.backward_micro_batch = counting  # type: ignore[method-assign]
        for step in (1, 2):
            metrics = trainer.train_step()
            assert calls["backward"] == step * accum
            assert metrics["optimizer_steps"] == step == agent.optimizer_steps
            assert agent.scheduler.last_epoch == step
            assert all(int(agent.optimizer.state[p]["step"]) == step for p in agent.params)
            assert all(p.grad is None for p in agent.params)
            assert metrics["effective_batch_size"] == 8 * accum
    finally:
        trainer.close()


# --- non-finite gradients -----------------------------------------------------------------------
@pytest.mark.parametrize("head", ["none", "c51", "qr"])
def test_nonfinite_gradients_skip_the_step(
    head: str, hp_factory, agent_factory, batch_factory
) -> None:
    # A NaN reward under C51 used to crash the projection (NaN indexed as INT64_MIN).
    hp = hp_factory(
        lr_schedule="cosine", lr_decay_steps=5, max_consecutive_nonfinite=5, distributional=head
    )
    agent = agent_factory(hp)
    agent.backward_only(batch_factory(64, seed=1), 1.0)
    agent.optimizer_step()  # one real step so Adam has state to protect
    params = _snapshot(agent)
    target = [p.detach().clone() for p in agent.target_net.parameters()]
    state = {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in agent.optimizer.state[p].items()}
        for i, p in enumerate(agent.params)
    }
    lr, epoch = agent.optimizer.param_groups[0]["lr"], agent.scheduler.last_epoch
    bad = batch_factory(64, seed=2)
    rewards = bad.rewards.clone()
    rewards[3] = float("nan")
    bad = type(bad)(**{**bad.__dict__, "rewards": rewards})
    for k in (1, 2):
        good_half, bad_half = batch_factory(32, seed=3), bad.slice(0, 32)
        agent.backward_only(good_half, 0.5)
        agent.backward_only(bad_half, 0.5)  # one poisoned micro-batch spoils the window
        stats = agent.optimizer_step()
        assert stats.skipped and not stats.clipped
        assert not math.isfinite(stats.pre_clip_norm)
        assert agent.skipped_steps == k and agent.consecutive_skips == k
        assert agent.optimizer_steps == 1 and stats.optimizer_steps == 1
        assert all(p.grad is None for p in agent.params)
        for p, before in zip(agent.params, params, strict=True):
            assert torch.equal(p, before)
        for p, before in zip(agent.target_net.parameters(), target, strict=True):
            assert torch.equal(p, before)
        for i, p in enumerate(agent.params):
            for key, value in state[i].items():
                assert torch.equal(
                    torch.as_tensor(agent.optimizer.state[p][key]), torch.as_tensor(value)
                ), key
        assert agent.optimizer.param_groups[0]["lr"] == lr
        assert agent.scheduler.last_epoch == epoch
    # A finite window steps again and resets the consecutive counter (not the total).
    agent.backward_only(batch_factory(64, seed=4), 1.0)
    stats = agent.optimizer_step()
    assert not stats.skipped and agent.consecutive_skips == 0 and agent.skipped_steps == 2
    assert agent.optimizer_steps == 2 and agent.scheduler.last_epoch == 2


@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_infinite_loss_with_bounded_gradient_is_skipped(
    loss: str, hp_factory, agent_factory, batch_factory
) -> None:
    """An infinite target gives an infinite Huber loss but a *finite* gradient: still skipped."""
    agent = agent_factory(hp_factory(loss=loss))
    before = _snapshot(agent)
    bad = batch_factory(16, seed=1)
    rewards = bad.rewards.clone()
    rewards[0] = float("inf")
    bad = type(bad)(**{**bad.__dict__, "rewards": rewards})
    assert agent.backward_only(bad, 1.0) == float("inf")
    stats = agent.optimizer_step()
    assert stats.skipped and agent.skipped_steps == 1
    assert all(torch.equal(p, b) for p, b in zip(agent.params, before, strict=True))


def test_optimizer_step_without_gradients_is_an_error(hp_factory, agent_factory) -> None:
    agent = agent_factory(hp_factory())
    with pytest.raises(RuntimeError, match="no accumulated gradients"):
        agent.optimizer_step()


# --- target sync --------------------------------------------------------------------------------
def _train_steps(agent: DQNAgent, batch_factory, n: int, accum: int = 1, seed0: int = 0):
    stats = []
    for s in range(n):
        for mb in batch_factory(16 * accum, seed=seed0 + s).split([16] * accum):
            agent.backward_only(mb, 1 / accum)
        stats.append(agent.optimizer_step())
    return stats


def test_hard_target_sync_counted_in_optimizer_steps(
    hp_factory, agent_factory, batch_factory
) -> None:
    hp = hp_factory(target_update_interval=3, tau=1.0, batch_size=16, gradient_accumulation_steps=4)
    agent = agent_factory(hp)
    initial = _flat(agent.target_net.parameters())
    torch.testing.assert_close(initial, _flat(agent.online_net.parameters()), rtol=0, atol=0)
    for step in range(1, 7):
        _train_steps(agent, batch_factory, 1, accum=4, seed0=step)
        tgt, onl = _flat(agent.target_net.parameters()), _flat(agent.online_net.parameters())
        if step % 3 == 0:
            assert torch.equal(tgt, onl), step
            synced = tgt.clone()
        elif step < 3:
            assert torch.equal(tgt, initial) and not torch.equal(tgt, onl)
        else:
            assert torch.equal(tgt, synced) and not torch.equal(tgt, onl)


def test_polyak_target_update(hp_factory, agent_factory, batch_factory) -> None:
    tau = 0.25
    hp = hp_factory(target_update_interval=1, tau=tau, batch_size=16)
    agent = agent_factory(hp)
    target = _flat(agent.target_net.parameters())
    for s in range(3):
        _train_steps(agent, batch_factory, 1, seed0=s)
        online = _flat(agent.online_net.parameters())
        target = target + tau * (online - target)
        torch.testing.assert_close(
            _flat(agent.target_net.parameters()), target, rtol=1e-6, atol=1e-7
        )
    assert all(not p.requires_grad for p in agent.target_net.parameters())


def test_skipped_steps_do_not_count_towards_target_sync(
    hp_factory, agent_factory, batch_factory
) -> None:
    hp = hp_factory(target_update_interval=2, batch_size=16)
    agent = agent_factory(hp)
    initial = _flat(agent.target_net.parameters())
    _train_steps(agent, batch_factory, 1)
    bad = batch_factory(16, seed=9, reward_scale=float("inf"))
    agent.backward_only(bad, 1.0)
    assert agent.optimizer_step().skipped
    assert torch.equal(_flat(agent.target_net.parameters()), initial)
    _train_steps(agent, batch_factory, 1, seed0=5)
    assert torch.equal(_flat(agent.target_net.parameters()), _flat(agent.online_net.parameters()))


# --- learning-rate schedules --------------------------------------------------------------------
def _cos(t: int, T: int, final: float) -> float:
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(t, T) / T))


LR_CASES: dict[str, tuple[dict[str, Any], list[float]]] = {
    "constant": ({}, [1.0] * 6),
    "warmup_constant": ({"lr_warmup_steps": 4}, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
    "linear": (
        {"lr_schedule": "linear", "lr_decay_steps": 4, "lr_final_ratio": 0.2},
        [1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2],
    ),
    "warmup_linear": (
        {"lr_schedule": "linear", "lr_warmup_steps": 2, "lr_decay_steps": 4, "lr_final_ratio": 0.2},
        [0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2],
    ),
    "cosine": (
        {"lr_schedule": "cosine", "lr_decay_steps": 4, "lr_final_ratio": 0.1},
        [_cos(t, 4, 0.1) for t in range(7)],
    ),
    "warmup_cosine": (
        {"lr_schedule": "cosine", "lr_warmup_steps": 3, "lr_decay_steps": 2, "lr_final_ratio": 0.0},
        [1 / 3, 2 / 3, 1.0, 1.0, 0.5, 0.0, 0.0],
    ),
    "step": (
        {"lr_schedule": "step", "lr_step_size": 2, "lr_step_gamma": 0.5},
        [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125],
    ),
    "warmup_step": (
        {"lr_schedule": "step", "lr_warmup_steps": 2, "lr_step_size": 3, "lr_step_gamma": 0.1},
        [0.5, 1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.01],
    ),
}


@pytest.mark.parametrize("case", list(LR_CASES))
def test_lr_schedule_per_optimizer_step(case: str, hp_factory, agent_factory, batch_factory):
    overrides, factors = LR_CASES[case]
    base_lr = 0.5
    hp = hp_factory(
        optimizer="sgd",
        learning_rate=base_lr,
        max_grad_norm=None,
        batch_size=8,
        gradient_accumulation_steps=2,
        **overrides,
    )
    agent = agent_factory(hp)
    for step, factor in enumerate(factors):
        for mb in batch_factory(16, seed=step).split([8, 8]):
            agent.backward_only(mb, 0.5)
        grads = _flat(p.grad for p in agent.params)
        before = _flat(agent.params)
        stats = agent.optimizer_step()
        assert stats.lr == pytest.approx(base_lr * factor, abs=1e-12), step
        # The LR reported is the one the update used: delta = -lr * g (SGD, no momentum).
        torch.testing.assert_close(
            _flat(agent.params) - before, -base_lr * factor * grads, rtol=1e-4, atol=1e-7
        )


@pytest.mark.parametrize("warmup", [0, 3])
def test_a_decay_over_the_run_ends_at_its_last_step_for_any_total(warmup: int) -> None:
    """lr_decay_steps None: the cosine decay ends at the last optimizer step that learn(total)
    takes, whatever the total (a fixed length ended early in a longer run, and hardly began in
    a shorter one)."""
    from foxhunt.trainer import planned_updates

    hp = DQNHyperparameters(
        hidden_sizes=(8,),
        learning_starts=100,
        batch_size=16,
        train_freq=4,
        lr_schedule="cosine",
        lr_warmup_steps=warmup,
        lr_final_ratio=0.1,
        eval_interval=0,
        device="cpu",
    )
    assert hp.lr_decay_steps is None
    for total in (300, 700):
        trainer = DQNTrainer(hp, "CartPole-v1")
        lrs: list[float] = []
        step = trainer.agent.optimizer_step

        def recording_step(step=step, lrs=lrs) -> Any:
            stats = step()
            lrs.append(stats.lr)
            return stats

        trainer.agent.optimizer_step = recording_step  # type: ignore[method-assign]
        try:
            trainer.learn(total)
        finally:
            trainer.close()
        n = planned_updates(0, total, hp)
        assert len(lrs) == n and trainer.agent.lr_decay_steps == n - 1 - warmup
        decay = [hp.learning_rate * _cos(t, n - 1 - warmup, 0.1) for t in range(n - warmup)]
        warm = [hp.learning_rate * (t + 1) / warmup for t in range(warmup)]
        assert lrs == pytest.approx(warm + decay, rel=1e-12)
        assert lrs[-1] == pytest.approx(hp.learning_rate * 0.1, rel=1e-12)


def test_an_agent_stepped_outside_a_trainer_needs_a_decay_length(
    hp_factory, agent_factory, batch_factory
) -> None:
    agent = agent_factory(hp_factory(lr_schedule="linear", lr_decay_steps=None))
    agent.backward_only(batch_factory(8, seed=0))
    before = [p.detach().clone() for p in agent.params]
    with pytest.raises(ConfigError, match="lr_decay_steps must be set to step an agent outside"):
        agent.optimizer_step()
    assert all(torch.equal(a, b) for a, b in zip(before, agent.params, strict=True))
    agent.plan_lr_decay(5)  # what DQNTrainer.learn does
    assert agent.optimizer_step().lr == pytest.approx(agent.hp.learning_rate)


# --- misc ---------------------------------------------------------------------------------------
def test_agent_rejects_unsupported_spaces(hp_factory) -> None:
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    with pytest.raises(ConfigError, match="action space must be Discrete"):
        DQNAgent(box, gym.spaces.Box(-1, 1, (2,)), hp_factory())
    # Discrete too, but many at once: the message names the joint Discrete that wraps them.
    with pytest.raises(ConfigError, match=r"the 6 joint choices, Discrete\(6\)"):
        DQNAgent(box, gym.spaces.MultiDiscrete([2, 3]), hp_factory())
    with pytest.raises(ConfigError, match=r"the 18446744073709551616 joint choices"):
        DQNAgent(box, gym.spaces.MultiDiscrete([2**32, 2**32]), hp_factory())  # no int64 wrap
    with pytest.raises(ConfigError, match=r"the 8 joint choices, Discrete\(8\)"):
        DQNAgent(box, gym.spaces.MultiBinary(3), hp_factory())
    with pytest.raises(ConfigError, match="regime_conditional must be false"):
        DQNAgent(box, gym.spaces.Discrete(2), hp_factory(regime_conditional=True))
    # An observation of no values trained a network without inputs, silently.
    for shape in ((0,), (4, 0)):
        empty = gym.spaces.Box(-1, 1, shape, np.float32)
        with pytest.raises(ConfigError, match="must hold at least one value, got: Box"):
            DQNAgent(empty, gym.spaces.Discrete(2), hp_factory())


def test_act_and_evaluation_mode(hp_factory, agent_factory) -> None:
    agent = agent_factory(hp_factory(noisy_nets=True))
    obs = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    greedy = agent.greedy_actions(obs)
    assert greedy.shape == (5,) and greedy.dtype == np.int64
    assert isinstance(agent.act(obs[0]), int)
    assert np.array_equal(agent.act(obs, epsilon=0.0), greedy)
    random_acts = np.concatenate([agent.act(obs, epsilon=1.0) for _ in range(40)])
    assert set(random_acts.tolist()) == {0, 1, 2}
    with agent.evaluation():
        assert not agent.online_net.training
        e1 = agent.greedy_actions(obs)
        agent.online_net.reset_noise(torch.Generator().manual_seed(3))
        assert np.array_equal(agent.greedy_actions(obs), e1)  # noise off in evaluation
    assert agent.online_net.training


def test_epsilon_greedy_matches_deciding_after_the_forward_pass(
    hp_factory, agent_factory, monkeypatch
) -> None:
    """act() draws the explore mask before running the network (and skips it when every env
    explores); the actions and the RNG stream are those of the plain recipe: greedy for all,
    then the mask, then random actions where it is set."""
    import copy

    agent = agent_factory(hp_factory())
    obs = np.random.default_rng(1).normal(size=(3, 6)).astype(np.float32)
    greedy = agent.greedy_actions(obs)
    calls = []
    real = agent._greedy  # the network pass act() runs
    monkeypatch.setattr(agent, "_greedy", lambda o: calls.append(1) or real(o))
    for eps in (0.0, 0.3, 0.7, 1.0):
        for _ in range(20):
            rng = copy.deepcopy(agent.rng)
            explore = rng.random(3) < eps if eps > 0 else np.zeros(3, bool)
            want = greedy
            if explore.any():
                want = np.where(explore, rng.integers(0, agent.n_actions, size=3), greedy)
            before = len(calls)
            assert np.array_equal(agent.act(obs, epsilon=eps), want)
            assert agent.rng.bit_generator.state == rng.bit_generator.state
            assert (len(calls) > before) == (not explore.all() or eps == 0.0)
            single = agent.act(obs[0], epsilon=eps)
            assert isinstance(single, int) and 0 <= single < agent.n_actions


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to CUDA here")
def test_fp16_with_auto_device_on_a_cpu_machine_is_refused(hp_factory, agent_factory) -> None:
    with pytest.raises(ConfigError, match=r"fp16' needs a CUDA device.*resolved to cpu"):
        agent_factory(hp_factory(mixed_precision="fp16", device="auto"))


def test_resolve_device_and_optimizers(hp_factory, agent_factory) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"device must be available, got: 'cuda:1'"):
            resolve_device("cuda:1")
    kinds = {
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "sgd": torch.optim.SGD,
        "rmsprop": torch.optim.RMSprop,
    }
    for name, cls in kinds.items():
        agent = agent_factory(hp_factory(optimizer=name, weight_decay=0.01))
        assert type(agent.optimizer) is cls
        assert agent.optimizer.param_groups[0]["weight_decay"] == 0.01


def test_split_sizes_and_batch_split(batch_factory) -> None:
    assert split_sizes(256, 4) == [64, 64, 64, 64]
    assert split_sizes(10, 3) == [4, 3, 3]
    with pytest.raises(ValueError, match="cannot split"):
        split_sizes(3, 4)
    batch = batch_factory(10)
    parts = batch.split([4, 3, 3])
    assert [len(p) for p in parts] == [4, 3, 3]
    back = Batch.cat(parts)
    for name in ("obs", "actions", "rewards", "next_obs", "dones", "discounts"):
        assert torch.equal(getattr(back, name), getattr(batch, name))
    with pytest.raises(ValueError, match="must be positive and sum to 10"):
        batch.split([5, 4])
    # Optional fields are set in every part or in none: dropping some parts' importance weights
    # would silently change the reference loss.
    weighted = parts[1].with_weights(torch.ones(3))
    assert Batch.cat([parts[0].with_weights(torch.ones(4)), weighted]).weights.shape == (7,)
    for mixed in ([parts[0], weighted], [weighted, parts[0]]):
        with pytest.raises(ValueError, match="field 'weights' is None in batch"):
            Batch.cat(mixed)


def test_compile_failure_falls_back_to_eager_with_a_warning(
    hp_factory, agent_factory, batch_factory, monkeypatch, caplog
) -> None:
    """A machine without what inductor needs (a C++ compiler) trains eagerly instead of dying."""

    def broken_compile(fn, **kwargs):  # type: ignore[no-untyped-def]
        def compiled(*args):  # type: ignore[no-untyped-def]
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore detail")

        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    agent = agent_factory(hp_factory(compile=True))
    eager = agent_factory(hp_factory())
    batch = batch_factory(32)
    agent.backward_only(batch)
    eager.backward_only(batch)
    assert "torch.compile failed (InvalidCxxCompiler: No working C++ compiler found)" in caplog.text
    for p, q in zip(agent.params, eager.params, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


def test_clipped_gradients_are_bitwise_clip_grad_norm_(
    hp_factory, agent_factory, batch_factory
) -> None:
    """The host-side coefficient rounds like torch's float32 maths: the optimizer receives the
    very gradients torch.nn.utils.clip_grad_norm_ would have produced, bit for bit."""
    agent = agent_factory(hp_factory(max_grad_norm=0.0123, hidden_sizes=(64, 64)))
    seen: list[list[torch.Tensor]] = []
    schedule = agent.scheduler.step

    def capture(*args, **kwargs):  # type: ignore[no-untyped-def]
        # Right after the optimizer consumed them (by step() or the direct fused kernel).
        seen.append([p.grad.clone() for p in agent.params])
        return schedule(*args, **kwargs)

    agent.scheduler.step = capture  # type: ignore[method-assign]
    for k in range(8):
        agent.backward_only(batch_factory(64, seed=k, reward_scale=3.0 + k))
        ref = [torch.nn.Parameter(p.detach().clone()) for p in agent.params]
        for r, p in zip(ref, agent.params, strict=True):
            r.grad = p.grad.clone()
        torch.nn.utils.clip_grad_norm_(ref, 0.0123)
        assert agent.optimizer_step().clipped
        for got, r in zip(seen[-1], ref, strict=True):
            assert torch.equal(got, r.grad)


def test_compile_failure_in_the_lazy_backward_falls_back_with_gradients_intact(
    hp_factory, agent_factory, batch_factory, monkeypatch, caplog
) -> None:
    class FailingBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x.clone()

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            raise RuntimeError("backward compilation failed")

    def lazy_broken_compile(fn, **kwargs):  # type: ignore[no-untyped-def]
        def compiled(*args):  # type: ignore[no-untyped-def]
            objective, *rest = fn(*args)
            return (FailingBackward.apply(objective), *rest)

        return compiled

    monkeypatch.setattr(torch, "compile", lazy_broken_compile)
    agent = agent_factory(hp_factory(compile=True))
    eager = agent_factory(hp_factory())
    first, second = batch_factory(32, seed=1), batch_factory(32, seed=2)
    eager.backward_only(first, 0.5)
    for p, q in zip(agent.params, eager.params, strict=True):  # a window already under way
        p.grad = q.grad.clone()
    agent.backward_only(second, 0.5)
    eager.backward_only(second, 0.5)
    assert "torch.compile failed (backward compilation failed)" in caplog.text
    for p, q in zip(agent.params, eager.params, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


WHOLE_STEP_VARIANTS: dict[str, dict[str, Any]] = {
    "plain_adam": {},
    "adamw_decay_schedule_clipping": {
        "optimizer": "adamw",
        "weight_decay": 0.05,
        "max_grad_norm": 0.215,
        "lr_schedule": "cosine",
        "lr_warmup_steps": 2,
        "lr_decay_steps": 5,
    },
    "rainbow_regime_per": {
        "double_q": True,
        "dueling": True,
        "distributional": "c51",
        "n_atoms": 11,
        "v_min": -5.0,
        "v_max": 5.0,
        "noisy_nets": True,
        "regime_conditional": True,
        "regime_gating": "soft",
        "target_update_interval": 2,
        "weight_decay": 0.01,
        "max_grad_norm": 0.3,
    },
}


def _optimizer_tensors(agent: DQNAgent) -> list[torch.Tensor]:
    """Adam's state, parameter by parameter (none before the first step)."""
    state = agent.optimizer.state
    return [
        state[p][k] for p in agent.params if p in state for k in ("exp_avg", "exp_avg_sq", "step")
    ]


@pytest.mark.parametrize("variant", list(WHOLE_STEP_VARIANTS), ids=list(WHOLE_STEP_VARIANTS))
def test_compiled_whole_step_equals_the_eager_step(
    variant: str, hp_factory, agent_factory, batch_factory
) -> None:
    """With ``compile``, ``update`` runs gradients, global norm, clipping and the Adam/AdamW update
    as one graph. Step after step it lands where ``backward`` + ``optimizer_step`` land, with the
    same statistics, PER weights and n-step discounts in the batch."""
    overrides = WHOLE_STEP_VARIANTS[variant]
    # adam_eps 1e-6: Adam divides by |g| + eps, so round-off in a near-zero gradient would
    # otherwise show as a visible parameter difference and force a loose tolerance.
    hp = hp_factory(learning_rate=1e-3, adam_eps=1e-6, **{"max_grad_norm": 1.0, **overrides})
    k = 3 if hp.regime_conditional else 0
    whole = agent_factory(hp.model_copy(update={"compile": True}), 8, 3, k)
    eager = agent_factory(hp, 8, 3, k)
    clipped = []
    for seed in range(5):
        batch = batch_factory(64, 8, 3, seed=seed, n_regimes=k, vary_discounts=True)
        batch = replace(batch, rewards=batch.rewards * (1 + 4 * seed))  # some steps clip
        if seed % 2:
            w = torch.from_numpy(np.random.default_rng(seed).uniform(0.2, 1.0, 64)).float()
            batch = replace(batch, weights=w / w.max())
        rw, sw = whole.update(batch)
        re_ = eager.backward_micro_batch(batch, 1.0)
        se = eager.optimizer_step()
        assert whole.graph_steps == seed + 1, "the step did not run as one graph"
        assert whole.learner_path == "whole_step_graph" and eager.learner_path == "eager"
        assert sw.pre_clip_norm == pytest.approx(se.pre_clip_norm, rel=1e-5)
        assert sw.post_clip_norm == pytest.approx(se.post_clip_norm, rel=1e-5)
        assert (sw.clipped, sw.skipped, sw.lr, sw.optimizer_steps) == (
            se.clipped,
            se.skipped,
            se.lr,
            se.optimizer_steps,
        )
        clipped.append(sw.clipped)
        for a, b in zip(
            (rw.loss, rw.td_errors, rw.q_mean, rw.q_abs_max),
            (re_.loss, re_.td_errors, re_.q_mean, re_.q_abs_max),
            strict=True,
        ):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(_flat(whole.params), _flat(eager.params), rtol=1e-5, atol=1e-7)
        # The target net is a copy of the online net at a sync step: the online net's tolerance.
        torch.testing.assert_close(
            _flat(whole.target_net.parameters()),
            _flat(eager.target_net.parameters()),
            rtol=1e-5,
            atol=1e-7,
        )
        torch.testing.assert_close(
            _flat(_optimizer_tensors(whole)), _flat(_optimizer_tensors(eager)), rtol=1e-4, atol=1e-9
        )
        for bw, be in zip(whole.online_net.buffers(), eager.online_net.buffers(), strict=True):
            assert torch.equal(bw, be)  # noise resampled alike, once per step
    if hp.max_grad_norm is not None and hp.max_grad_norm < 1.0:
        assert any(clipped) and not all(clipped)
    assert whole.scheduler.last_epoch == eager.scheduler.last_epoch == 5


def test_compiled_whole_step_skips_a_non_finite_step(
    hp_factory, agent_factory, batch_factory
) -> None:
    """A NaN reward gives NaN gradients: the one-graph step leaves parameters, Adam's state and the
    schedule as they were and counts a skip, as the eager step does, and the next step goes on."""
    hp = hp_factory(learning_rate=1e-3, adam_eps=1e-6, max_grad_norm=1.0)
    whole = agent_factory(hp.model_copy(update={"compile": True}))
    eager = agent_factory(hp)
    good, bad = batch_factory(32, seed=1), batch_factory(32, seed=2)
    bad = replace(bad, rewards=torch.where(torch.arange(32) == 3, math.nan, bad.rewards))
    for batch in (good, bad, good):
        before = _flat([*whole.params, *_optimizer_tensors(whole)])
        _, sw = whole.update(batch)
        eager.backward_micro_batch(batch, 1.0)
        se = eager.optimizer_step()
        assert (sw.skipped, sw.optimizer_steps) == (se.skipped, se.optimizer_steps)
        if sw.skipped:
            assert math.isnan(sw.pre_clip_norm) and math.isnan(sw.post_clip_norm)
            assert torch.equal(_flat([*whole.params, *_optimizer_tensors(whole)]), before)
        torch.testing.assert_close(_flat(whole.params), _flat(eager.params), rtol=1e-5, atol=1e-7)
    assert whole.skipped_steps == eager.skipped_steps == 1
    assert whole.optimizer_steps == 2 and whole.scheduler.last_epoch == 2


def _compile_failing(name: str, broken: Any) -> Any:
    """A stand-in for ``torch.compile``: ``broken`` for the function called ``name``, every
    other function uncompiled (the test is about that one graph)."""

    def compile_(fn, **kwargs):  # type: ignore[no-untyped-def]
        return broken if fn.__name__ == name else fn

    return compile_


@pytest.mark.parametrize("part_way", [False, True], ids=["at_compile", "part_way"])
def test_whole_step_failure_falls_back_with_state_intact(
    part_way: bool, hp_factory, agent_factory, batch_factory, monkeypatch, caplog
) -> None:
    """A whole-step graph that fails on its first call (at compilation, or after it began to write
    in place) is said once; the step runs the other way from untouched parameters and state."""

    def broken(params, exp_avgs, *rest):  # type: ignore[no-untyped-def]
        if part_way:
            torch._foreach_add_(params, 1.0)
            torch._foreach_add_(exp_avgs, 1.0)
        raise RuntimeError("inductor: whole-step lowering failed\nmore detail")

    monkeypatch.setattr(torch, "compile", _compile_failing("whole_step", broken))
    hp = hp_factory(learning_rate=1e-3)
    agent = agent_factory(hp.model_copy(update={"compile": True}))
    eager = agent_factory(hp)
    for seed in range(3):
        batch = batch_factory(32, seed=seed)
        agent.update(batch)
        eager.backward_micro_batch(batch, 1.0)
        eager.optimizer_step()
    assert caplog.text.count("the whole-step graph failed (inductor: whole-step lowering") == 1
    assert agent._whole_step is None and agent.optimizer_steps == 3
    assert torch.equal(_flat(agent.params), _flat(eager.params))
    assert torch.equal(_flat(_optimizer_tensors(agent)), _flat(_optimizer_tensors(eager)))


def test_whole_step_steps_aside_when_adam_constants_change(
    hp_factory, agent_factory, batch_factory
) -> None:
    """Betas and eps are constants of the traced graph: changed in the optimizer's group mid-run,
    the step goes the other way and still matches the eager step with the new values."""
    hp = hp_factory(learning_rate=1e-3, adam_eps=1e-6)
    whole = agent_factory(hp.model_copy(update={"compile": True}))
    eager = agent_factory(hp)
    for seed in range(4):
        if seed == 2:
            for agent in (whole, eager):
                agent.optimizer.param_groups[0]["betas"] = (0.5, 0.9)
        batch = batch_factory(32, seed=seed)
        whole.update(batch)
        eager.backward_micro_batch(batch, 1.0)
        eager.optimizer_step()
        assert whole._whole_step_usable() == (seed < 2)
        torch.testing.assert_close(_flat(whole.params), _flat(eager.params), rtol=1e-5, atol=1e-7)


def test_whole_step_graphs_of_many_configurations_stay_compiled(
    hp_factory, agent_factory, batch_factory
) -> None:
    """Agents of different configurations in one process (a hyperparameter search) each keep
    their compiled graphs (the whole step and the gradient graph): Dynamo's recompile limit counts
    per code object, and past it a shared one would run uncompiled (the whole step 3x slower
    than compile=False). The limit is lowered to 2 here so that three configurations cross it;
    a shared code object would give 2 + 2 graphs instead of 6."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(recompile_limit=2):
        for k in range(3):
            agent = agent_factory(
                hp_factory(compile=True, hidden_sizes=(8, 8), max_grad_norm=1.0 + k)
            )
            for seed in range(2):
                agent.update(batch_factory(32, seed=seed))
                agent.backward_only(batch_factory(32, seed=seed))  # the gradient graph's
                agent.optimizer_step()
            assert agent.graph_steps == 2
    assert (
        counters["stats"]["unique_graphs"] - before == 6
    )  # a whole step and a gradient graph each


def test_whole_step_steps_aside_when_max_grad_norm_changes(
    hp_factory, agent_factory, batch_factory
) -> None:
    """The clip threshold is traced into the graph too: an agent given other hyperparameters
    with another ``max_grad_norm`` steps the other way, clipping at the new threshold."""
    hp = hp_factory(learning_rate=1e-3, adam_eps=1e-6, max_grad_norm=10.0)
    whole = agent_factory(hp.model_copy(update={"compile": True}))
    eager = agent_factory(hp)
    for seed in range(3):
        if seed == 1:
            whole.hp = whole.hp.model_copy(update={"max_grad_norm": 1e-3})
            eager.hp = eager.hp.model_copy(update={"max_grad_norm": 1e-3})
        batch = batch_factory(32, seed=seed)
        _, sw = whole.update(batch)
        eager.backward_micro_batch(batch, 1.0)
        se = eager.optimizer_step()
        assert sw.clipped == se.clipped == (seed >= 1)
        assert sw.post_clip_norm == pytest.approx(se.post_clip_norm, rel=1e-5)
        torch.testing.assert_close(_flat(whole.params), _flat(eager.params), rtol=1e-5, atol=1e-7)


def test_whole_step_compiles_a_few_batch_layouts_then_steps_aside(
    hp_factory, agent_factory, batch_factory, monkeypatch
) -> None:
    """Each batch layout (size, PER weights or none, discounts or none) is a graph of its own. A
    caller of ``update`` who varies it gets graphs for the first few layouts (2 here, to keep the
    test short); further layouts step the other way (past Dynamo's recompile limit a graph would
    run uncompiled, slower than eager), with the same results."""
    import foxhunt.learner

    limit = 2
    monkeypatch.setattr(foxhunt.learner, "_GRAPHS_PER_FUNCTION", limit)
    hp = hp_factory(learning_rate=1e-3, adam_eps=1e-6, hidden_sizes=(8, 8))
    whole = agent_factory(hp.model_copy(update={"compile": True}))
    eager = agent_factory(hp)
    # (size, with PER weights): the second layout differs from the first by its weights only.
    layouts = [(8, False), (8, True), (9, False), (8, False), (10, True)]
    graphs: list[tuple[int, bool]] = []
    for n, weighted in layouts:
        batch = batch_factory(n, seed=n)
        if weighted:
            batch = replace(batch, weights=torch.linspace(0.5, 1.0, n))
        expect = (n, weighted) in graphs or len(graphs) < limit
        before = whole.graph_steps
        whole.update(batch)
        eager.backward_micro_batch(batch, 1.0)
        eager.optimizer_step()
        assert (whole.graph_steps == before + 1) == expect, (n, weighted)
        if expect and (n, weighted) not in graphs:
            graphs.append((n, weighted))
        torch.testing.assert_close(_flat(whole.params), _flat(eager.params), rtol=1e-5, atol=1e-7)
    assert graphs == [(8, False), (8, True)] and whole.graph_steps == 3


def test_gradient_graph_failure_falls_back_to_the_compiled_objective(
    hp_factory, agent_factory, batch_factory, monkeypatch, caplog
) -> None:
    """A micro-batch gradient graph that fails on its first call is said once; accumulation goes
    on through the objective path, gradients intact, the window already under way included."""

    def broken(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("inductor: gradient graph lowering failed\nmore detail")

    monkeypatch.setattr(torch, "compile", _compile_failing("micro_batch_gradients", broken))
    hp = hp_factory(learning_rate=1e-3)
    agent = agent_factory(hp.model_copy(update={"compile": True}))
    eager = agent_factory(hp)
    for seed in range(3):
        batch = batch_factory(32, seed=seed)
        agent.backward_only(batch, 0.5)
        eager.backward_only(batch, 0.5)
    assert caplog.text.count("the gradient graph failed (inductor: gradient graph lowering") == 1
    assert agent._grad_graph is None and agent.learner_path == "compiled_objective"
    for p, q in zip(agent.params, eager.params, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
