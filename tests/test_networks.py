"""QNetwork and NoisyLinear: shapes of every head combination, dueling identity, noise, gating."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from foxhunt.config import DQNHyperparameters
from foxhunt.errors import ConfigError
from foxhunt.networks import InputMajorLinear, NoisyLinear, QNetwork

OBS, ACT, K = 7, 3, 3

COMBOS = list(
    itertools.product([False, True], ["none", "c51", "qr"], [False, True], ["off", "hard", "soft"])
)


def _net(hp_factory, *, dueling=False, dist="none", noisy=False, regime="off", n_atoms=5):
    hp = hp_factory(
        dueling=dueling,
        distributional=dist,
        noisy_nets=noisy,
        n_atoms=n_atoms,
        regime_conditional=regime != "off",
        regime_gating="soft" if regime == "soft" else "hard",
        v_min=-3.0,
        v_max=3.0,
    )
    torch.manual_seed(0)
    return QNetwork(OBS, ACT, hp, n_regimes=K if regime != "off" else 0)


def _obs(n: int = 10, seed: int = 0, one_hot: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, OBS, generator=g)
    probs = torch.rand(n, K, generator=g).softmax(dim=1)
    if one_hot is not None:
        probs = F.one_hot(torch.full((n,), one_hot), K).float()
    x[:, -K:] = probs
    return x


@pytest.mark.parametrize(("dueling", "dist", "noisy", "regime"), COMBOS)
def test_output_shapes(hp_factory, dueling: bool, dist: str, noisy: bool, regime: str) -> None:
    net = _net(hp_factory, dueling=dueling, dist=dist, noisy=noisy, regime=regime)
    out = net(_obs(10))
    assert out.shape == ((10, ACT) if dist == "none" else (10, ACT, 5))
    q = net.q_values(out)
    assert q.shape == (10, ACT) and q.dtype == torch.float32 and torch.isfinite(q).all()
    assert net.is_noisy == noisy
    n_heads = K if regime != "off" else 1
    n_out = 1 if dist == "none" else 5
    assert net.n_heads == n_heads
    assert net.adv_head.out_features == n_heads * ACT * n_out
    assert (net.value_head is not None) == dueling
    assert net.head_outputs(net.torso(_obs(10))).shape == (10, n_heads, ACT, n_out)
    if dist == "c51":  # expected value lies inside the support
        assert q.min() >= -3.0 and q.max() <= 3.0
        torch.testing.assert_close(q, (out.softmax(-1) * torch.linspace(-3, 3, 5)).sum(-1))
    if dist == "qr":
        torch.testing.assert_close(q, out.mean(-1))


@pytest.mark.parametrize("dist", ["none", "c51", "qr"])
def test_dueling_identity(hp_factory, dist: str) -> None:
    net = _net(hp_factory, dueling=True, dist=dist)
    x = _obs(8)
    out = net(x)
    h = net.torso(x)
    n_out = 1 if dist == "none" else 5
    value = net.value_head(h).view(8, 1, n_out)
    adv = net.adv_head(h).view(8, ACT, n_out)
    out3 = out.view(8, ACT, n_out)
    # Q - V is the centred advantage: its mean over actions is zero, and it equals A - mean(A).
    torch.testing.assert_close(out3.mean(dim=1, keepdim=True), value, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out3 - value, adv - adv.mean(dim=1, keepdim=True))


def test_noisy_linear_modes_and_noise() -> None:
    torch.manual_seed(0)
    layer = NoisyLinear(5, 4, sigma0=0.5)
    x = torch.randn(6, 5)
    # Eval: mean weights, deterministic regardless of the noise buffers.
    layer.reset_noise(torch.Generator().manual_seed(1))
    layer.eval()
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight_mu, layer.bias_mu))
    # Train: weights from the buffers, factorised: W = mu + sigma * outer(f(e_out), f(e_in)).
    layer.train()
    g = torch.Generator().manual_seed(1)
    e_in, e_out = torch.randn(5, generator=g), torch.randn(4, generator=g)
    f_in, f_out = e_in.sign() * e_in.abs().sqrt(), e_out.sign() * e_out.abs().sqrt()
    torch.testing.assert_close(layer.eps_in, f_in)
    torch.testing.assert_close(layer.eps_out, f_out)
    w = layer.weight_mu + layer.weight_sigma * torch.outer(f_out, f_in)
    b = layer.bias_mu + layer.bias_sigma * f_out
    y1 = layer(x)
    torch.testing.assert_close(y1, F.linear(x, w, b))
    torch.testing.assert_close(layer(x), y1)  # no resampling per forward pass
    assert not torch.allclose(y1, F.linear(x, layer.weight_mu, layer.bias_mu))
    # Initial sigma is sigma0 / sqrt(fan_in).
    torch.testing.assert_close(layer.weight_sigma, torch.full((4, 5), 0.5 / np.sqrt(5)))
    layer.reset_noise(g)
    assert not torch.allclose(layer(x), y1)


def test_network_noise_reset_and_eval(hp_factory) -> None:
    net = _net(hp_factory, noisy=True, dueling=True)
    x = _obs(4)
    net.train()
    net.reset_noise(torch.Generator().manual_seed(0))
    a = net(x)
    torch.testing.assert_close(net(x), a)
    net.reset_noise(torch.Generator().manual_seed(1))
    b = net(x)
    assert not torch.allclose(a, b)
    net.reset_noise(torch.Generator().manual_seed(0))
    torch.testing.assert_close(net(x), a)  # the generator fully determines the noise
    net.eval()
    e1 = net(x)
    net.reset_noise(torch.Generator().manual_seed(5))
    torch.testing.assert_close(net(x), e1)


def _manual_heads(net: QNetwork, x: torch.Tensor) -> list[torch.Tensor]:
    """Per-regime outputs [B, A, N] computed from the fused layers' row blocks, head by head."""
    h = net.torso(x)
    n_out, heads = net.n_out, []
    for k in range(net.n_heads):
        rows = slice(k * ACT * n_out, (k + 1) * ACT * n_out)
        adv = F.linear(h, net.adv_head.weight[rows], net.adv_head.bias[rows]).view(-1, ACT, n_out)
        if net.value_head is not None:
            vrows = slice(k * n_out, (k + 1) * n_out)
            v = F.linear(h, net.value_head.weight[vrows], net.value_head.bias[vrows])
            adv = v.view(-1, 1, n_out) + adv - adv.mean(dim=1, keepdim=True)
        heads.append(adv)
    return heads


@pytest.mark.parametrize("dist", ["none", "c51"])
def test_hard_gating_selects_the_head(hp_factory, dist: str) -> None:
    net = _net(hp_factory, regime="hard", dist=dist, dueling=True)
    n_out = net.n_out
    x = _obs(6, one_hot=1)
    base = net(x).detach().clone()
    with torch.no_grad():
        for k in (0, 2):  # one action's row of heads 0 and 2 (survives the dueling centring)
            net.adv_head.weight[k * ACT * n_out].add_(1.0)
            net.value_head.bias[k * n_out : (k + 1) * n_out].add_(3.0)
    torch.testing.assert_close(net(x), base)  # other heads do not matter
    with torch.no_grad():
        net.adv_head.weight[1 * ACT * n_out].add_(0.5)
    assert not torch.allclose(net(x), base)
    # Soft probabilities under hard gating: the argmax regime's head is used.
    xs = _obs(6, seed=3)
    sel = xs[:, -K:].argmax(dim=1)
    assert len(set(sel.tolist())) > 1
    heads = torch.stack(_manual_heads(net, xs), dim=1)
    expected = heads[torch.arange(6), sel]
    expected = expected.squeeze(-1) if dist == "none" else expected
    torch.testing.assert_close(net(xs), expected)


@pytest.mark.parametrize("dueling", [False, True])
def test_soft_gating_mixes_heads(hp_factory, dueling: bool) -> None:
    net = _net(hp_factory, regime="soft", dist="qr", dueling=dueling)
    x = _obs(6, seed=2)
    probs = x[:, -K:]
    per_head = _manual_heads(net, x)
    expected = sum(probs[:, k, None, None] * per_head[k] for k in range(K))
    torch.testing.assert_close(net(x), expected)


def test_regime_config_errors(hp_factory) -> None:
    hp = hp_factory(regime_conditional=True)
    with pytest.raises(ValueError, match="n_regimes"):
        QNetwork(OBS, ACT, hp, n_regimes=0)
    with pytest.raises(ValueError, match="exceeds the observation size"):
        QNetwork(2, ACT, hp, n_regimes=3)
    # Without regime_conditional, n_regimes is ignored (one head).
    assert QNetwork(OBS, ACT, hp_factory(), n_regimes=3).n_heads == 1


def test_residual_gating_is_shared_head_plus_weighted_corrections(hp_factory) -> None:
    """residual: Q = head_0(h) + sum_k p_k head_k(h), checked against the head blocks by hand."""
    K = 3
    hp = hp_factory(regime_conditional=True, regime_gating="residual", dueling=False)
    net = QNetwork(OBS, ACT, hp, n_regimes=K)
    assert net.n_heads == K + 1
    torch.manual_seed(0)
    obs = torch.randn(5, OBS)
    obs[:, -K:] = torch.softmax(torch.randn(5, K), dim=1)
    with torch.no_grad():
        net.adv_head.weight[ACT:].normal_()  # corrections start at zero: give them values
        net.adv_head.bias[ACT:].normal_()
        heads = net.head_outputs(net.torso(obs)).squeeze(-1)  # [B, K + 1, A]
        expected = heads[:, 0] + (obs[:, -K:, None] * heads[:, 1:]).sum(dim=1)
        torch.testing.assert_close(net(obs), expected)
        # With the corrections zeroed the network is exactly the plain shared head.
        net.adv_head.weight[ACT:].zero_()
        net.adv_head.bias[ACT:].zero_()
        torch.testing.assert_close(net(obs), net.head_outputs(net.torso(obs))[:, 0].squeeze(-1))


@pytest.mark.parametrize(
    ("dist", "noisy"), [("none", False), ("c51", False), ("qr", True)], ids=["q", "c51", "qr-noisy"]
)
def test_residual_corrections_start_at_zero_and_learn(hp_factory, dist: str, noisy: bool) -> None:
    """A fresh residual network is the plain shared head; its corrections still get gradients."""
    hp = hp_factory(
        regime_conditional=True,
        regime_gating="residual",
        dueling=True,
        distributional=dist,
        noisy_nets=noisy,
        n_atoms=5,
        v_min=-3.0,
        v_max=3.0,
    )
    torch.manual_seed(0)
    net = QNetwork(OBS, ACT, hp, n_regimes=K).eval()
    x = _obs(8, seed=4)
    shared = net.head_outputs(net.torso(x))[:, 0]
    torch.testing.assert_close(net(x), shared.squeeze(-1) if dist == "none" else shared)
    # The shared head is not trivially zero, so the equality above compares real outputs.
    per_head = net.adv_head.weight_mu if noisy else net.adv_head.weight
    assert per_head[: ACT * net.n_out].abs().sum() > 0
    net.train()
    net.q_values(net(x)).gather(1, torch.zeros(8, 1, dtype=torch.long)).sum().backward()
    grad = (net.adv_head.weight_mu if noisy else net.adv_head.weight).grad
    assert grad[ACT * net.n_out :].abs().sum() > 0
    value = net.value_head.weight_mu if noisy else net.value_head.weight
    assert value.grad[net.n_out :].abs().sum() > 0


@pytest.mark.parametrize("gating", ["hard", "residual"])
def test_regime_outside_the_torso_acts_through_the_gates_only(hp_factory, gating: str) -> None:
    hp = hp_factory(
        regime_conditional=True, regime_gating=gating, regime_in_torso=False, dueling=True
    )
    torch.manual_seed(0)
    net = QNetwork(OBS, ACT, hp, n_regimes=K)
    assert net.torso[0].in_features == OBS - K
    with torch.no_grad():
        net.adv_head.weight.normal_()  # non-zero corrections
        x = _obs(6, seed=5)
        p1 = torch.softmax(torch.randn(6, K), dim=1)
        p2 = torch.softmax(torch.randn(6, K), dim=1)

        def q(probs: torch.Tensor) -> torch.Tensor:
            return net(torch.cat([x[:, :-K], probs], dim=1))

        heads = net.head_outputs(net.torso(x[:, :-K])).squeeze(-1)  # [B, heads, A]
        if gating == "residual":
            # Q is affine in the probabilities: the mixture of two is the mixture of their Qs.
            torch.testing.assert_close(q(0.3 * p1 + 0.7 * p2), 0.3 * q(p1) + 0.7 * q(p2))
            expected = heads[:, 0] + (p1[:, :, None] * heads[:, 1:]).sum(dim=1)
        else:
            expected = heads[torch.arange(6), p1.argmax(dim=1)]
        torch.testing.assert_close(q(p1), expected)
    with pytest.raises(ValueError, match="regime_in_torso=False"):
        QNetwork(K, ACT, hp, n_regimes=K)


# --- input-major first layer ----------------------------------------------------------------------
def test_input_major_linear_is_nn_linear_in_values_gradients_and_state_dict():
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 16)
    torch.manual_seed(0)
    layer = InputMajorLinear(4, 16)
    assert torch.equal(layer.weight_t.t(), ref.weight)  # nn.Linear's initialisation, draw for draw
    assert torch.equal(layer.bias, ref.bias)
    x = torch.randn(32, 4)
    y_ref, y = ref(x), layer(x)
    torch.testing.assert_close(y, y_ref)
    grad_out = torch.randn(32, 16)
    y_ref.backward(grad_out)
    y.backward(grad_out)
    torch.testing.assert_close(layer.weight_t.grad.t(), ref.weight.grad)
    torch.testing.assert_close(layer.bias.grad, ref.bias.grad)
    # The fused Adam kernel reads parameter, gradient and state as flat memory: keep them alike.
    assert layer.weight_t.is_contiguous() and layer.weight_t.grad.is_contiguous()
    x3 = torch.randn(2, 5, 4)
    torch.testing.assert_close(layer(x3), ref(x3))
    # Files hold nn.Linear's [out, in] layout both ways.
    state = layer.state_dict()
    assert list(state) == ["bias", "weight"] and state["weight"].shape == (16, 4)
    assert torch.equal(state["weight"], ref.weight)
    other = InputMajorLinear(4, 16)
    other.load_state_dict(ref.state_dict())
    assert torch.equal(other.weight_t.t(), ref.weight) and other.weight_t.is_contiguous()
    plain = torch.nn.Linear(4, 16)
    plain.load_state_dict(state)
    torch.testing.assert_close(plain(x), y)


@pytest.mark.parametrize("obs_dim", [1, 2, 4, 10, 11, 64])
def test_only_a_narrow_first_layer_is_input_major(hp_factory, obs_dim):
    net = QNetwork(obs_dim, ACT, hp_factory(hidden_sizes=(8, 8)))
    first, second = net.torso[0], net.torso[2]
    assert isinstance(first, InputMajorLinear) == (2 <= obs_dim <= 10)
    assert type(second) is torch.nn.Linear
    assert net.state_dict()["torso.0.weight"].shape == (8, obs_dim)


@pytest.mark.parametrize(
    "shape",
    [(4, 84, 84), (84, 84, 3), (84, 84, 12), (84, 84), (1, 36, 36)],
    ids=["CHW", "HWC", "HWC-12", "HW", "min"],
)
def test_the_nature_cnn_reads_either_layout_flat_or_shaped(shape: tuple[int, ...]) -> None:
    """(C, H, W) and (H, W, C) frames give the same Q-values whether the batch comes shaped or
    flat (replay and the losses hand it flat); channels-last is the same image permuted."""
    hp = DQNHyperparameters(torso="cnn", hidden_sizes=(16,), dueling=True, distributional="qr")
    torch.manual_seed(0)
    net = QNetwork(math.prod(shape), 5, hp, obs_shape=shape)
    x = torch.rand(3, *shape)
    out = net(x)
    assert out.shape == (3, 5, hp.n_atoms)
    torch.testing.assert_close(net(x.flatten(1)), out, rtol=0, atol=0)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))
    ]  # fmt: skip
    if len(shape) == 3 and shape[-1] < shape[0]:  # channels last: the CHW twin
        torch.manual_seed(0)
        chw = QNetwork(math.prod(shape), 5, hp, obs_shape=(shape[2], shape[0], shape[1]))
        torch.testing.assert_close(chw(x.permute(0, 3, 1, 2)), out)


def test_the_nature_cnn_refuses_what_it_cannot_read() -> None:
    hp = DQNHyperparameters(torso="cnn")
    with pytest.raises(ConfigError, match=r"shape \(35, 35, 3\), got: 'cnn' .*at least 36 x 36"):
        QNetwork(35 * 35 * 3, 2, hp, obs_shape=(35, 35, 3))
    with pytest.raises(ConfigError, match=r"observations of shape \(9,\), got: 'cnn'"):
        QNetwork(9, 2, hp, obs_shape=(9,))
    with pytest.raises(ConfigError, match=r"shape \(40, 40, 40\), got: 'cnn' .*smallest axis"):
        QNetwork(40 * 40 * 40, 2, hp, obs_shape=(40, 40, 40))  # which axis is the channels?
    with pytest.raises(ConfigError, match="regime_conditional must be false with torso 'cnn'"):
        QNetwork(3 * 40 * 40, 2, hp.replace(regime_conditional=True), 2, obs_shape=(3, 40, 40))
