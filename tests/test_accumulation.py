"""Gradient accumulation is exact: n micro-batches of b equal one batch of n*b, for every variant.

Two identical agents ("twins") see the same 256 transitions sampled from a real replay buffer
(uniform or prioritized, filled through the n-step accumulator). One accumulates micro-batches with
scale ``len(micro) / 256``; the other runs one backward pass over all 256. Gradients, clipping
statistics, learning rates and parameters after each optimizer step must agree to float32 round-off.
Scalar heads are also checked against an independent hand-written double-DQN loss.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from foxhunt.batch import Batch
from foxhunt.config import DQNHyperparameters
from foxhunt.learner import DQNAgent
from foxhunt.replay import NStepAccumulator, PrioritizedReplayBuffer, ReplayBuffer
from foxhunt.trainer import DQNTrainer

EFF = 256
OBS_DIM, N_ACT, K = 6, 3, 3
IMAGE = (2, 36, 36)  # the smallest frames the Nature convolutions take (torso: cnn)
RTOL, ATOL = 1e-5, 1e-6

# Every variant trains with SGD + momentum: Adam's first step is ~lr * sign(g), which would turn
# float32 round-off in near-zero gradients into visible parameter differences and hide real bugs
# behind a loose tolerance.
BASE: dict[str, Any] = dict(
    optimizer="sgd",
    learning_rate=0.05,
    momentum=0.9,
    gamma=0.9,
    max_grad_norm=0.1,
)
RAINBOW: dict[str, Any] = dict(
    double_q=True,
    dueling=True,
    prioritized_replay=True,
    n_step=3,
    distributional="c51",
    n_atoms=11,
    v_min=-5.0,
    v_max=5.0,
    noisy_nets=True,
)
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "double_off": {"double_q": False},
    "mse_no_clip": {"loss": "mse", "max_grad_norm": None},
    "dueling": {"dueling": True},
    "per": {"prioritized_replay": True},
    "nstep": {"n_step": 3},
    "noisy": {"noisy_nets": True},
    "c51": {"distributional": "c51", "n_atoms": 11, "v_min": -5.0, "v_max": 5.0},
    "qr": {"distributional": "qr", "n_atoms": 8},
    "regime_hard": {"regime_conditional": True, "regime_gating": "hard"},
    "regime_soft": {"regime_conditional": True, "regime_gating": "soft"},
    "regime_residual": {"regime_conditional": True, "regime_gating": "residual"},
    "regime_gates_only": {
        "regime_conditional": True,
        "regime_gating": "residual",
        "regime_in_torso": False,
    },
    "lr_warmup_cosine": {"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 3},
    "polyak": {"tau": 0.3, "target_update_interval": 1},
    "rainbow_regime": {
        **RAINBOW,
        "regime_conditional": True,
        "regime_gating": "soft",
        "lr_schedule": "linear",
        "lr_warmup_steps": 1,
        "lr_decay_steps": 4,
        "target_update_interval": 2,
    },
    "rainbow_regime_hard": {**RAINBOW, "regime_conditional": True, "regime_gating": "hard"},
    "rainbow_cnn": {**RAINBOW, "torso": "cnn", "hidden_sizes": (16,), "lr_schedule": "cosine"},
}
SPLITS = {"4x64": [64, 64, 64, 64], "100-60-60-36": [100, 60, 60, 36]}


def _hp(hp_factory, **overrides: Any) -> DQNHyperparameters:
    return hp_factory(**{**BASE, **overrides, "batch_size": 64, "gradient_accumulation_steps": 4})


def _n_regimes(hp: DQNHyperparameters) -> int:
    return K if hp.regime_conditional else 0


def _shape(hp: DQNHyperparameters) -> tuple[int, ...]:
    return IMAGE if hp.torso == "cnn" else (OBS_DIM,)


def _obs(
    n: int, shape: tuple[int, ...], rng: np.random.Generator, k: int, soft: bool
) -> np.ndarray:
    """Gaussian features whose last ``k`` entries are regime probabilities (soft or one-hot)."""
    obs = rng.normal(size=(n, *shape)).astype(np.float32)
    if k:
        probs = rng.dirichlet(np.ones(k), size=n) if soft else np.eye(k)[rng.integers(0, k, n)]
        obs[:, -k:] = probs
    return obs


def _filled_replay(hp: DQNHyperparameters, seed: int = 0) -> ReplayBuffer:
    """A replay filled through the n-step accumulator from 2 envs with random episode ends."""
    rng = np.random.default_rng(seed)
    k = _n_regimes(hp)
    soft = hp.regime_gating != "hard"
    shape = _shape(hp)
    if hp.prioritized_replay:
        buf: ReplayBuffer = PrioritizedReplayBuffer(1024, shape, alpha=0.6, seed=seed)
    else:
        buf = ReplayBuffer(1024, shape, seed=seed)
    acc = NStepAccumulator(hp.n_step, hp.gamma, 2)
    obs = _obs(2, shape, rng, k, soft)
    for _ in range(300):
        nxt = _obs(2, shape, rng, k, soft)
        term = rng.random(2) < 0.08
        trunc = (rng.random(2) < 0.05) & ~term
        tr = acc.push(obs, rng.integers(0, N_ACT, 2), rng.normal(size=2), nxt, term, trunc)
        buf.add(*tr)
        ended = (term | trunc).reshape(-1, *[1] * len(shape))
        obs = np.where(ended, _obs(2, shape, rng, k, soft), nxt)
    if isinstance(buf, PrioritizedReplayBuffer):
        buf.update_priorities(np.arange(len(buf)), rng.exponential(size=len(buf)))
    return buf


def _twins(hp: DQNHyperparameters, agent_factory) -> tuple[DQNAgent, DQNAgent]:
    n_reg = _n_regimes(hp)
    if hp.torso == "cnn":
        space = gym.spaces.Box(-np.inf, np.inf, IMAGE, np.float32)
        a, b = (DQNAgent(space, gym.spaces.Discrete(N_ACT), hp) for _ in range(2))
        a.plan_lr_decay(10), b.plan_lr_decay(10)  # as DQNTrainer.learn does
    else:
        a = agent_factory(hp, OBS_DIM, N_ACT, n_regimes=n_reg)
        b = agent_factory(hp, OBS_DIM, N_ACT, n_regimes=n_reg)
    for pa, pb in zip(
        a.online_net.state_dict().values(), b.online_net.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb)
    return a, b


def _grads(agent: DQNAgent) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in agent.params]


def _assert_lists_close(xs, ys, rtol: float = RTOL, atol: float = ATOL) -> None:
    assert len(xs) == len(ys)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, msg=f"tensor {i} differs")


def _reference_scalar_grads(agent: DQNAgent, batch: Batch) -> list[torch.Tensor]:
    """Independent big-batch gradient of the (weighted) double/plain DQN loss, written by hand."""
    hp, net, tgt = agent.hp, agent.online_net, agent.target_net
    q = net(batch.obs).gather(1, batch.actions[:, None]).squeeze(1)
    with torch.no_grad():
        chooser = net if hp.double_q else tgt
        a_star = chooser(batch.next_obs).argmax(dim=1, keepdim=True)
        next_q = tgt(batch.next_obs).gather(1, a_star).squeeze(1)
        y = batch.rewards + batch.discounts * (1.0 - batch.dones) * next_q
    if hp.loss == "huber":
        per = F.huber_loss(q, y, reduction="none", delta=hp.huber_delta)
    else:
        per = 0.5 * (y - q) ** 2
    w = torch.ones_like(per) if batch.weights is None else batch.weights
    return list(torch.autograd.grad((per * w).sum() / len(batch), agent.params))


@pytest.mark.parametrize("split", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_accumulation_equals_big_batch(
    variant: str, split: list[int], hp_factory, agent_factory
) -> None:
    hp = _hp(hp_factory, **VARIANTS[variant])
    buf = _filled_replay(hp)
    acc, big = _twins(hp, agent_factory)
    for step in range(3):
        batch = buf.sample(EFF, beta=0.5)
        if step == 0:
            assert len(batch) == EFF
            if hp.prioritized_replay:
                assert batch.weights is not None and batch.weights.std() > 0.05
            if hp.n_step > 1:  # discounts vary per sample; some transitions terminate
                assert len(torch.unique(batch.discounts)) == 3 and batch.dones.sum() > 0
        noise_before = [b.clone() for b in acc.online_net.buffers()]
        losses = [acc.backward_only(mb, len(mb) / EFF) for mb in batch.split(split)]
        for before, after in zip(noise_before, acc.online_net.buffers(), strict=True):
            assert torch.equal(before, after)  # same noise for every micro-batch of the window
        big_loss = big.backward_only(batch, 1.0)
        _assert_lists_close(_grads(acc), _grads(big))
        weighted = sum(x * len(mb) for x, mb in zip(losses, batch.split(split), strict=True))
        assert weighted / EFF == pytest.approx(big_loss, rel=1e-5)
        if hp.distributional == "none" and not hp.regime_conditional and not hp.noisy_nets:
            _assert_lists_close(_grads(big), _reference_scalar_grads(big, batch))
        sa, sb = acc.optimizer_step(), big.optimizer_step()
        assert sa.pre_clip_norm == pytest.approx(sb.pre_clip_norm, rel=1e-5)
        assert sa.post_clip_norm == pytest.approx(sb.post_clip_norm, rel=1e-5)
        assert (sa.clipped, sa.lr, sa.optimizer_steps) == (sb.clipped, sb.lr, sb.optimizer_steps)
        _assert_lists_close(list(acc.online_net.parameters()), list(big.online_net.parameters()))
        _assert_lists_close(list(acc.target_net.parameters()), list(big.target_net.parameters()))
        for ba, bb in zip(acc.online_net.buffers(), big.online_net.buffers(), strict=True):
            assert torch.equal(ba, bb)
    assert acc.optimizer_steps == big.optimizer_steps == 3
    assert acc.scheduler.last_epoch == 3


@pytest.mark.parametrize("variant", ["plain", "rainbow_regime"])
def test_compiled_accumulation_equals_eager_big_batch(
    variant: str, hp_factory, agent_factory
) -> None:
    """``compile: true`` (a compiled gradient graph per micro-batch shape, added up in ``.grad``)
    accumulating 100/60/60/36 lands where the eager 1x256 step lands."""
    hp = _hp(hp_factory, **VARIANTS[variant])
    buf = _filled_replay(hp)
    n_reg = _n_regimes(hp)
    compiled = agent_factory(hp.model_copy(update={"compile": True}), OBS_DIM, N_ACT, n_reg)
    eager = agent_factory(hp, OBS_DIM, N_ACT, n_reg)
    for _ in range(2):
        batch = buf.sample(EFF, beta=0.5)
        for mb in batch.split(SPLITS["100-60-60-36"]):
            compiled.backward_only(mb, len(mb) / EFF)
            assert compiled.learner_path == "compiled_gradients"  # a graph per micro-batch
        eager.backward_only(batch, 1.0)
        _assert_lists_close(_grads(compiled), _grads(eager), rtol=1e-4, atol=1e-6)
        sc, se = compiled.optimizer_step(), eager.optimizer_step()
        assert sc.pre_clip_norm == pytest.approx(se.pre_clip_norm, rel=1e-4)
        assert sc.clipped == se.clipped
        _assert_lists_close(
            list(compiled.online_net.parameters()),
            list(eager.online_net.parameters()),
            rtol=1e-4,
            atol=1e-6,
        )


@pytest.mark.parametrize("variant", ["plain", "rainbow_regime"])
def test_compiled_whole_step_equals_eager_accumulation(
    variant: str, hp_factory, agent_factory
) -> None:
    """With ``compile`` and Adam, a window of one micro-batch of 256 runs as one graph (gradients,
    norm, clipping, update); it lands where eager accumulation of 4 x 64 lands. Adam's eps is
    1e-6 so that round-off in near-zero gradients stays round-off in the parameters."""
    adam = dict(optimizer="adam", learning_rate=1e-3, adam_eps=1e-6)
    hp = _hp(hp_factory, **{**VARIANTS[variant], **adam})
    buf = _filled_replay(hp)
    n_reg = _n_regimes(hp)
    whole = agent_factory(hp.model_copy(update={"compile": True}), OBS_DIM, N_ACT, n_reg)
    acc = agent_factory(hp, OBS_DIM, N_ACT, n_reg)
    for step in range(3):
        batch = buf.sample(EFF, beta=0.5)
        _, sw = whole.update(batch)
        for mb in batch.split(SPLITS["4x64"]):
            acc.backward_only(mb, len(mb) / EFF)
        sa = acc.optimizer_step()
        assert whole.graph_steps == step + 1  # every step ran as one graph
        assert sw.pre_clip_norm == pytest.approx(sa.pre_clip_norm, rel=1e-5)
        assert (sw.clipped, sw.lr, sw.optimizer_steps) == (sa.clipped, sa.lr, sa.optimizer_steps)
        _assert_lists_close(
            list(whole.online_net.parameters()), list(acc.online_net.parameters()), atol=1e-7
        )
        _assert_lists_close(
            list(whole.target_net.parameters()), list(acc.target_net.parameters()), atol=1e-7
        )


@pytest.mark.parametrize("variant", ["dueling", "rainbow_regime"])
def test_bf16_accumulation_matches_bf16_big_batch(variant: str, hp_factory, agent_factory) -> None:
    """bf16 autocast on CPU: compare with the same bf16 computation on the big batch."""
    hp = _hp(hp_factory, mixed_precision="bf16", **VARIANTS[variant])
    buf = _filled_replay(hp)
    batch = buf.sample(EFF, beta=0.5)
    acc, big = _twins(hp, agent_factory)
    for mb in batch.split([64] * 4):
        acc.backward_only(mb, 0.25)
    big.backward_only(batch, 1.0)
    ga, gb = _grads(acc), _grads(big)
    # Loose: bf16 keeps 8 mantissa bits and CPU kernels may block the two batch sizes differently.
    _assert_lists_close(ga, gb, rtol=2e-2, atol=2e-3)
    total = torch.linalg.vector_norm(
        torch.cat([g.flatten() for g in ga]) - torch.cat([g.flatten() for g in gb])
    )
    assert total / torch.linalg.vector_norm(torch.cat([g.flatten() for g in gb])) < 1e-2
    # Autocast is really on: an fp32 twin gives measurably different gradients.
    fp32 = agent_factory(hp.replace(mixed_precision="off"), OBS_DIM, N_ACT, _n_regimes(hp))
    fp32.backward_only(batch, 1.0)
    diff = max((x - y).abs().max().item() for x, y in zip(_grads(fp32), gb, strict=True))
    assert diff > 1e-6


def test_per_weights_normalised_per_micro_batch_do_not_match(hp_factory, agent_factory) -> None:
    """The wrong variant (max-normalising weights inside each micro-batch) breaks exactness."""
    hp = _hp(hp_factory, prioritized_replay=True)
    buf = _filled_replay(hp)
    batch = buf.sample(EFF, beta=0.5)
    assert batch.weights is not None
    right, wrong = _twins(hp, agent_factory)
    ref, _ = _twins(hp, agent_factory)
    ref.backward_only(batch, 1.0)
    for mb in batch.split([64] * 4):
        right.backward_only(mb, 0.25)
        assert mb.weights is not None
        wrong.backward_only(mb.with_weights(mb.weights / mb.weights.max()), 0.25)
    _assert_lists_close(_grads(right), _grads(ref))
    rel = max(
        ((w - r).norm() / r.norm()).item() for w, r in zip(_grads(wrong), _grads(ref), strict=True)
    )
    assert rel > 1e-2, "per-micro-batch normalisation should change the gradient"
    with pytest.raises(AssertionError):
        _assert_lists_close(_grads(wrong), _grads(ref))


def test_unscaled_micro_batches_do_not_match(hp_factory, agent_factory) -> None:
    """Forgetting the len/256 scale gives 4x the gradient: the comparison can fail."""
    hp = _hp(hp_factory)
    batch = _filled_replay(hp).sample(EFF)
    a, b = _twins(hp, agent_factory)
    for mb in batch.split([64] * 4):
        a.backward_only(mb, 1.0)
    b.backward_only(batch, 1.0)
    _assert_lists_close([g / 4 for g in _grads(a)], _grads(b))
    with pytest.raises(AssertionError):
        _assert_lists_close(_grads(a), _grads(b))


def test_noise_resampled_once_per_optimizer_step(hp_factory, agent_factory) -> None:
    hp = _hp(hp_factory, noisy_nets=True)
    agent = agent_factory(hp, OBS_DIM, N_ACT)
    batch = _filled_replay(hp).sample(EFF)
    eps0 = [b.clone() for b in agent.online_net.buffers()]
    for mb in batch.split([64] * 4):
        agent.backward_only(mb, 0.25)
    assert all(torch.equal(x, y) for x, y in zip(eps0, agent.online_net.buffers(), strict=True))
    agent.optimizer_step()
    assert not all(torch.equal(x, y) for x, y in zip(eps0, agent.online_net.buffers(), strict=True))


# --- through the trainer ------------------------------------------------------------------------
def _trainer(hp_factory, batch_size: int, accum: int, **overrides: Any) -> DQNTrainer:
    hp = hp_factory(
        **{
            **BASE,
            "batch_size": batch_size,
            "gradient_accumulation_steps": accum,
            "learning_starts": 256,
            "buffer_capacity": 1000,
            "n_envs": 2,
            "train_freq": 1000,
            "eval_interval": 0,
            **overrides,
        }
    )
    return DQNTrainer(hp, "CartPole-v1")


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "prioritized_replay": True,
            "n_step": 3,
            "dueling": True,
            "optimizer": "adam",
            "learning_rate": 1e-3,
        },
        {
            "prioritized_replay": True,
            "n_step": 3,
            "dueling": True,
            "optimizer": "adam",
            "learning_rate": 1e-3,
            "compile": True,
        },
    ],
    # compiled: 4 x 64 as a gradient graph per micro-batch, 1 x 256 as one whole-step graph.
    ids=["sgd_uniform", "adam_per_nstep", "adam_per_nstep_compiled"],
)
def test_trainer_train_step_accumulation_equals_big_batch(hp_factory, overrides) -> None:
    t_acc = _trainer(hp_factory, 64, 4, **overrides)
    t_big = _trainer(hp_factory, 256, 1, **overrides)
    try:
        for _ in range(160):  # 320 env steps over 2 envs, identical random actions
            t_acc.collect_step()
            t_big.collect_step()
        for name in ("obs", "actions", "rewards", "next_obs", "dones", "discounts"):
            assert torch.equal(getattr(t_acc.replay, name), getattr(t_big.replay, name))
        _assert_lists_close(
            list(t_acc.agent.online_net.parameters()),
            list(t_big.agent.online_net.parameters()),
            rtol=0,
            atol=0,
        )
        for _ in range(2):
            ma, mb = t_acc.train_step(), t_big.train_step()
            assert ma["effective_batch_size"] == mb["effective_batch_size"] == 256
            assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-5)
            assert ma["grad_norm_pre_clip"] == pytest.approx(mb["grad_norm_pre_clip"], rel=1e-5)
            # Adam's first steps are ~lr * sign(g): allow round-off in near-zero gradients.
            atol = 1e-5 * t_acc.hp.learning_rate if t_acc.hp.optimizer == "adam" else ATOL
            _assert_lists_close(
                list(t_acc.agent.online_net.parameters()),
                list(t_big.agent.online_net.parameters()),
                atol=atol,
            )
            if isinstance(t_acc.replay, PrioritizedReplayBuffer):
                np.testing.assert_allclose(
                    t_acc.replay.tree.tree, t_big.replay.tree.tree, rtol=1e-4, atol=1e-7
                )
        if t_big.hp.compile:  # the big window went through the one-graph step
            assert t_big.agent.graph_steps == 2 and t_acc.agent.graph_steps == 0
            assert t_acc.agent.learner_path == "compiled_gradients"
        assert t_acc.agent.optimizer_steps == t_big.agent.optimizer_steps == 2
        assert t_acc.agent.scheduler.last_epoch == 2
    finally:
        t_acc.close()
        t_big.close()
