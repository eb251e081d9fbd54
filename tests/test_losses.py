"""Pure loss functions against hand-computed arrays (Dopamine-style projection tests)."""

from __future__ import annotations

import math

import pytest
import torch

from foxhunt import losses

SUPPORT = torch.linspace(-2.0, 2.0, 5)  # z = [-2, -1, 0, 1, 2], delta_z = 1
PROBS = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])


def _project(reward: float, discount: float, done: float, probs: torch.Tensor = PROBS):
    return losses.categorical_projection(
        probs[None],
        torch.tensor([reward]),
        torch.tensor([discount]),
        torch.tensor([done]),
        SUPPORT,
    )[0]


@pytest.mark.parametrize(
    ("reward", "discount", "done", "expected"),
    [
        # Tz = z + 0.5 = [-1.5, -0.5, 0.5, 1.5, 2.5 -> 2]: each atom splits half/half, the last
        # lands beyond the upper edge and is clamped onto it.
        (0.5, 1.0, 0.0, [0.05, 0.15, 0.25, 0.275, 0.275]),
        # Tz = z + 1 lands exactly on support points; the last atom is clamped onto v_max.
        (1.0, 1.0, 0.0, [0.0, 0.1, 0.2, 0.3, 0.4]),
        # Tz = -3 + 0.5 z = [-4, -3.5, -3, -2.5, -2]: everything beyond the lower edge.
        (-3.0, 0.5, 0.0, [1.0, 0.0, 0.0, 0.0, 0.0]),
        # Everything beyond the upper edge.
        (5.0, 0.9, 0.0, [0.0, 0.0, 0.0, 0.0, 1.0]),
        # done = 1: Tz = r = 0.3 for every atom -> b = 2.3: 0.7 to z=0, 0.3 to z=1.
        (0.3, 0.9, 1.0, [0.0, 0.0, 0.7, 0.3, 0.0]),
        # discount 0.5 (an n-step discount, not gamma): Tz = [-1, -.5, 0, .5, 1].
        (0.0, 0.5, 0.0, [0.0, 0.2, 0.525, 0.275, 0.0]),
        # discount 0 behaves like done: all mass at r = -1 (exactly a support point).
        (-1.0, 0.0, 0.0, [0.0, 1.0, 0.0, 0.0, 0.0]),
    ],
)
def test_categorical_projection_hand_computed(
    reward: float, discount: float, done: float, expected: list[float]
) -> None:
    out = _project(reward, discount, done)
    torch.testing.assert_close(out, torch.tensor(expected), rtol=0, atol=1e-6)
    assert out.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_categorical_projection_batched_matches_rows_and_conserves_mass() -> None:
    g = torch.Generator().manual_seed(0)
    b, n = 64, 11
    support = torch.linspace(-5.0, 5.0, n)
    probs = torch.rand(b, n, generator=g).softmax(dim=1)
    rewards = 4 * torch.randn(b, generator=g)
    discounts = torch.rand(b, generator=g)
    dones = (torch.rand(b, generator=g) < 0.3).float()
    out = losses.categorical_projection(probs, rewards, discounts, dones, support)
    torch.testing.assert_close(out.sum(dim=1), torch.ones(b), rtol=0, atol=1e-5)
    assert (out >= 0).all()
    # Each row is independent of the others.
    for i in (0, 17, 63):
        row = losses.categorical_projection(
            probs[i : i + 1], rewards[i : i + 1], discounts[i : i + 1], dones[i : i + 1], support
        )
        torch.testing.assert_close(out[i : i + 1], row)
    # The projection preserves the mean when no atom is clamped (linear interpolation).
    inside = (rewards.abs() < 0.5) & (discounts < 0.9)
    assert int(inside.sum()) >= 3
    mean_target = rewards + discounts * (1 - dones) * (probs * support).sum(dim=1)
    torch.testing.assert_close(
        (out * support).sum(dim=1)[inside], mean_target[inside], rtol=0, atol=1e-5
    )


def test_categorical_projection_does_not_modify_inputs() -> None:
    probs = PROBS[None].clone()
    r, d, dn = torch.tensor([0.5]), torch.tensor([0.9]), torch.tensor([0.0])
    losses.categorical_projection(probs, r, d, dn, SUPPORT)
    assert torch.equal(probs, PROBS[None]) and r.item() == 0.5


def test_categorical_loss_is_cross_entropy() -> None:
    logits = torch.log(torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]]))
    target = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    loss, prio = losses.categorical_loss(logits, target)
    expected = torch.tensor([-math.log(0.3), -(0.5 * math.log(0.6) + 0.5 * math.log(0.1))])
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(prio, expected)
    assert not prio.requires_grad


def test_quantile_huber_loss_hand_computed() -> None:
    # tau = [0.25, 0.75]; theta = [0, 1]; targets [0.5, 3]; u_ij = T_j - theta_i:
    #   i=0: u = [0.5, 3]    huber = [0.125, 2.5]   |tau - 1{u<0}| = [0.25, 0.25]
    #   i=1: u = [-0.5, 2]   huber = [0.125, 1.5]   |tau - 1{u<0}| = [0.25, 0.75]
    # rho = [[0.03125, 0.625], [0.03125, 1.125]] -> mean over j, sum over i = 0.90625.
    theta = torch.tensor([[0.0, 1.0]])
    target = torch.tensor([[0.5, 3.0]])
    loss, td = losses.quantile_huber_loss(theta, target, kappa=1.0)
    assert loss.item() == pytest.approx(0.90625, abs=1e-6)
    assert td.item() == pytest.approx((0.5 + 3.0 + 0.5 + 2.0) / 4, abs=1e-6)
    # kappa = 2: huber_2(u)/2: i=0 -> [0.0625, 2.0], i=1 -> [0.0625, 1.0];
    # rho = [[0.015625, 0.5], [0.015625, 0.75]] -> 0.2578125 + 0.3828125 = 0.640625.
    loss2, _ = losses.quantile_huber_loss(theta, target, kappa=2.0)
    assert loss2.item() == pytest.approx(0.640625, abs=1e-6)


def test_quantile_loss_gradient_pushes_quantiles_to_tau() -> None:
    """The gradient of a lone quantile w.r.t. many targets vanishes at the tau-quantile."""
    targets = torch.arange(100, dtype=torch.float64)[None] / 99  # uniform on [0, 1]
    theta = torch.tensor([[0.25, 0.75]], dtype=torch.float64, requires_grad=True)
    loss, _ = losses.quantile_huber_loss(theta, targets, kappa=1e-3)
    (grad,) = torch.autograd.grad(loss.sum(), theta)
    assert grad.abs().max().item() < 0.02  # ~1/100 per sample misplaced


def test_scalar_losses_per_sample() -> None:
    q = torch.zeros(3)
    target = torch.tensor([0.5, 2.0, -3.0])
    huber, td = losses.scalar_td_loss(q, target, "huber", 1.0)
    torch.testing.assert_close(huber, torch.tensor([0.125, 1.5, 2.5]))
    torch.testing.assert_close(td, target)
    huber2, _ = losses.scalar_td_loss(q, target, "huber", 2.0)
    torch.testing.assert_close(huber2, torch.tensor([0.125, 2.0, 4.0]))
    mse, td2 = losses.scalar_td_loss(q + 1.0, target, "mse")
    torch.testing.assert_close(mse, torch.tensor([0.125, 0.5, 8.0]))
    torch.testing.assert_close(td2, target - 1.0)
    with pytest.raises(ValueError, match="unknown loss kind"):
        losses.scalar_td_loss(q, target, "l1")


def test_td_target() -> None:
    r = torch.tensor([1.0, 1.0, -2.0])
    disc = torch.tensor([0.9, 0.81, 0.5])
    done = torch.tensor([0.0, 1.0, 0.0])
    nxt = torch.tensor([10.0, 10.0, 4.0])
    torch.testing.assert_close(losses.td_target(r, disc, done, nxt), torch.tensor([10.0, 1.0, 0.0]))


# --- the agent's loss: which network picks the next action, which one values it -----------------
def _reference_loss(agent, batch, double_q: bool) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Per-sample loss written out from the papers, sample by sample, with plain Python loops:
    double DQN (van Hasselt et al. 2016) picks a' with the online net and values it with the
    target net; plain DQN does both with the target net."""
    hp = agent.hp
    with torch.no_grad():
        out = agent.online_net(batch.obs).double()
        next_online = agent.online_net(batch.next_obs).double()
        next_target = agent.target_net(batch.next_obs).double()
    if hp.distributional == "c51":
        z = torch.linspace(hp.v_min, hp.v_max, hp.n_atoms, dtype=torch.float64)
        to_q = lambda o: (o.softmax(dim=-1) * z).sum(dim=-1)  # noqa: E731
    elif hp.distributional == "qr":
        to_q = lambda o: o.mean(dim=-1)  # noqa: E731
    else:
        to_q = lambda o: o  # noqa: E731
    losses_ = []
    for j in range(batch.obs.shape[0]):
        a = int(batch.actions[j])
        a_next = int(to_q(next_online[j] if double_q else next_target[j]).argmax())
        r, d = float(batch.rewards[j]), float(batch.dones[j])
        g = float(batch.discounts[j]) * (1.0 - d)
        if hp.distributional == "none":
            err = r + g * float(next_target[j, a_next]) - float(out[j, a])
            delta = hp.huber_delta
            val = 0.5 * err**2 if abs(err) <= delta else delta * (abs(err) - 0.5 * delta)
        elif hp.distributional == "c51":
            p = next_target[j, a_next].softmax(dim=-1)
            dz = (hp.v_max - hp.v_min) / (hp.n_atoms - 1)
            m = [0.0] * hp.n_atoms
            for i in range(hp.n_atoms):
                b = (min(max(r + g * float(z[i]), hp.v_min), hp.v_max) - hp.v_min) / dz
                lo, up = math.floor(b), math.ceil(b)
                if lo == up:
                    m[lo] += float(p[i])
                else:
                    m[lo] += float(p[i]) * (up - b)
                    m[up] += float(p[i]) * (b - lo)
            logp = out[j, a].log_softmax(dim=-1)
            val = -sum(m[i] * float(logp[i]) for i in range(hp.n_atoms))
        else:
            theta = out[j, a]
            target = [r + g * float(t) for t in next_target[j, a_next]]
            n, kappa = len(theta), hp.huber_delta
            val = 0.0
            for i in range(n):
                tau = (2 * i + 1) / (2 * n)
                for t in target:
                    u = t - float(theta[i])
                    h = 0.5 * u**2 if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
                    val += abs(tau - (1.0 if u < 0 else 0.0)) * h / kappa / len(target)
        losses_.append(val)
    return torch.tensor(losses_, dtype=torch.float64)


@pytest.mark.parametrize("distributional", ["none", "c51", "qr"])
@pytest.mark.parametrize("double_q", [True, False])
def test_agent_loss_matches_the_papers_sample_by_sample(
    hp_factory, agent_factory, batch_factory, distributional: str, double_q: bool
) -> None:
    """The agent's per-sample loss against :func:`_reference_loss`, with a target network made
    to disagree with the online one, so that picking a' with the wrong network shows."""
    extra = {"n_atoms": 11, "v_min": -3.0, "v_max": 3.0} if distributional != "none" else {}
    hp = hp_factory(distributional=distributional, double_q=double_q, dueling=True, **extra)
    agent = agent_factory(hp)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in agent.target_net.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    batch = batch_factory(48, seed=3, vary_discounts=True)
    with torch.no_grad():
        on = agent.online_net.q_values(agent.online_net(batch.next_obs)).argmax(dim=1)
        tg = agent.online_net.q_values(agent.target_net(batch.next_obs)).argmax(dim=1)
    assert (on != tg).sum() >= 5  # the two networks disagree on a' often enough to matter
    assert 0 < batch.dones.sum() < len(batch.dones)
    loss, _, _ = agent.compute_loss(batch)
    expected = _reference_loss(agent, batch, double_q)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-4, atol=1e-5)
