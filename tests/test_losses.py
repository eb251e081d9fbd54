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
