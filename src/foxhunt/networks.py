"""Q-networks: an MLP (or Nature CNN) torso with scalar, dueling, distributional, noisy and
per-regime heads.

One class covers every combination so each Rainbow switch composes with the others instead of
multiplying subclasses. ``forward`` returns the raw head output (Q-values, C51 logits or quantiles);
:meth:`QNetwork.q_values` turns any of them into expected Q-values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foxhunt.config import DQNHyperparameters
from foxhunt.errors import ConfigError

# ReLU works in place: the layer before it never needs its own output for the backward, so the
# torso saves one activation-sized allocation per layer (about 2% of a batch-256 learner step).
_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": lambda: nn.ReLU(inplace=True),
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
}

# Input widths for which the first layer stores its weight input-major (InputMajorLinear).
INPUT_MAJOR_WIDTHS = range(2, 11)


class InputMajorLinear(nn.Module):
    """``nn.Linear`` with its weight stored ``[in, out]`` (``weight_t``), for narrow inputs.

    The backward of ``x @ W^T`` computes the weight gradient as ``dY^T X``; with ``W`` stored
    transposed it is ``X^T dY``, the same numbers in the product layout MKL runs fast when ``X``
    has 2-10 columns: 78 us against 14 us at batch 256 for 4 inputs x 256 units, 1.2-10x over
    batch 32-1024 and 64-512 units (BENCHMARKS.md section 1). Classic-control observations
    (CartPole 4, Acrobot 6, LunarLander 8) are that narrow. The layout stays internal: initial
    values are ``nn.Linear``'s draw for draw, and state dicts (checkpoints, model files) hold
    ``weight`` in ``nn.Linear``'s ``[out, in]`` layout both ways.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        ref = nn.Linear(in_features, out_features)  # its initialisation, its RNG draws
        self.weight_t = nn.Parameter(ref.weight.detach().t().contiguous())
        self.bias = nn.Parameter(ref.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return torch.addmm(self.bias, x, self.weight_t)
        return torch.matmul(x, self.weight_t) + self.bias

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[no-untyped-def]
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = destination.pop(prefix + "weight_t").t()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        if prefix + "weight" in state_dict and prefix + "weight_t" not in state_dict:
            state_dict[prefix + "weight_t"] = state_dict.pop(prefix + "weight").t()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, input-major"


class NoisyLinear(nn.Module):
    """Linear layer with factorised Gaussian noise (Fortunato et al. 2018, Eq. 10-11).

    Noise lives in buffers and changes only in :meth:`reset_noise`, which the agent calls once per
    optimizer step: every micro-batch of one accumulation window sees the same weights, so
    accumulation stays exact. In ``eval()`` mode the layer uses its mean weights (greedy evaluation
    is deterministic). A private generator makes the noise independent of other RNG consumers
    (and identical across data-parallel ranks that share a seed).
    """

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(
            torch.empty(out_features, in_features).uniform_(-bound, bound)
        )
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))
        self.register_buffer("eps_in", torch.zeros(in_features))
        self.register_buffer("eps_out", torch.zeros(out_features))

    @staticmethod
    def _scaled(x: torch.Tensor) -> torch.Tensor:
        return x.sign() * x.abs().sqrt()

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Draw new factorised noise f(eps_in), f(eps_out) with f(x) = sgn(x) sqrt(|x|)."""
        dev = self.eps_in.device
        e_in = torch.randn(self.in_features, generator=generator)
        e_out = torch.randn(self.out_features, generator=generator)
        self.eps_in.copy_(self._scaled(e_in).to(dev))
        self.eps_out.copy_(self._scaled(e_out).to(dev))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in)
        bias = self.bias_mu + self.bias_sigma * self.eps_out
        return F.linear(x, weight, bias)


# The Nature DQN convolutions (Mnih et al. 2015): (out_channels, kernel, stride).
NATURE_CONVS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def image_layout(shape: Sequence[int]) -> tuple[int, int, int, bool] | None:
    """``(channels, height, width, channels_last)`` of an observation shape the convolutions
    read: ``(C, H, W)`` or ``(H, W, C)``, the channels being the one axis smaller than both
    others (stacked frames, RGB, SB3's ``VecFrameStack`` of RGB: ``(H, W, 12)``), or ``(H, W)``;
    None for any other (no such axis: the layout would be a guess)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 2:
        return 1, shape[0], shape[1], False
    if len(shape) == 3 and shape[0] < min(shape[1:]):
        return shape[0], shape[1], shape[2], False
    if len(shape) == 3 and shape[2] < min(shape[:2]):
        return shape[2], shape[0], shape[1], True
    return None


class ConvTorso(nn.Module):
    """The Nature DQN convolutions over an image observation, flattened.

    Takes the observation flat (``[B, prod(shape)]``, as every other torso does) or shaped, in
    either layout: ``(C, H, W)`` (stacked frames, Gymnasium's ``FrameStackObservation``) or
    ``(H, W, C)`` (RGB), the channels the smallest axis; a 2-D ``(H, W)`` is one channel.
    """

    def __init__(self, shape: Sequence[int], activation: Callable[[], nn.Module]) -> None:
        super().__init__()
        shape = tuple(int(d) for d in shape)
        layout = image_layout(shape)
        if layout is None:
            raise ConfigError(
                f"torso must be 'mlp' for observations of shape {shape}, got: 'cnn' (it reads "
                "images (C, H, W) or (H, W, C) with C the smallest axis, or (H, W))"
            )
        c, h, w, self.channels_last = layout
        self.shape = shape
        layers: list[nn.Module] = []
        for out, kernel, stride in NATURE_CONVS:
            layers += [nn.Conv2d(c, out, kernel, stride), activation()]
            c, h, w = out, (h - kernel) // stride + 1, (w - kernel) // stride + 1
            if h < 1 or w < 1:
                raise ConfigError(
                    f"torso must be 'mlp' for images of shape {shape}, got: 'cnn' (the Nature "
                    "convolutions need at least 36 x 36 pixels)"
                )
        self.convs = nn.Sequential(*layers, nn.Flatten())
        self.out_features = c * h * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.shape)
        if len(self.shape) == 2:
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.convs(x)


def stored_transposed(net: nn.Module) -> list[bool]:
    """Per parameter, whether it is stored transposed from ``nn.Linear``'s ``[out, in]`` layout
    (an :class:`InputMajorLinear` weight). Files hold nn.Linear's layout, optimizer state
    included, so checkpoints do not depend on the storage and those from before it still load."""
    flipped = {id(m.weight_t) for m in net.modules() if isinstance(m, InputMajorLinear)}
    return [id(p) in flipped for p in net.parameters()]


def _c51_support(v_min: float, v_max: float, n_atoms: int) -> torch.Tensor:
    """The C51 atoms in float32. Edges past its range made torch.linspace raise, or returned
    inf/nan atoms and NaN losses: refused here for every run (new runs are also checked for
    distinct atoms by ``DQNHyperparameters.check_new``)."""
    try:
        support = torch.linspace(v_min, v_max, n_atoms)
    except RuntimeError:
        support = None
    if support is None or not bool(torch.isfinite(support).all()):
        raise ConfigError(
            "v_min and v_max must leave the C51 support finite in float32, got: "
            f"v_min={v_min!r}, v_max={v_max!r}"
        )
    return support


class QNetwork(nn.Module):
    """MLP torso + (dueling) head(s) producing ``[B, A]`` Q-values or ``[B, A, N]`` atoms.

    With ``n_regimes > 0`` the last ``n_regimes`` observation entries are regime probabilities
    (causal estimates from the environment); each regime gets its own head over a shared torso and
    the output is the selected head (hard gating: argmax regime), the probability-weighted mix
    (soft gating) or a shared head plus probability-weighted corrections (residual). With
    ``regime_in_torso=False`` the torso reads only the other entries, so the regime acts through
    the gating alone. Reading the regime from the observation keeps the replay, the batch and
    every Rainbow component unaware of regimes, so they all compose with it unchanged.
    """

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hp: DQNHyperparameters,
        n_regimes: int = 0,
        obs_shape: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.n_actions = n_actions
        self.distributional = hp.distributional
        self.n_out = 1 if hp.distributional == "none" else hp.n_atoms
        self.dueling = hp.dueling
        self.n_regimes = n_regimes if hp.regime_conditional else 0
        self.gating = hp.regime_gating
        if hp.regime_conditional and n_regimes < 1:
            raise ValueError("regime_conditional needs an environment that reports n_regimes >= 1")
        if self.n_regimes > obs_dim:
            raise ValueError(f"n_regimes={n_regimes} exceeds the observation size {obs_dim}")

        # Without regime_in_torso the torso reads everything but the regime probabilities.
        self.torso_inputs: int | None = None  # None: the whole observation
        if self.n_regimes and not hp.regime_in_torso:
            if obs_dim - self.n_regimes < 1:
                raise ValueError(
                    f"regime_in_torso=False needs observation entries besides the {n_regimes} "
                    f"regime probabilities; the observation has {obs_dim}"
                )
            obs_dim -= self.n_regimes
            self.torso_inputs = obs_dim
        act = _ACTIVATIONS[hp.activation]
        layers: list[nn.Module] = []
        width = obs_dim
        if hp.torso == "cnn":
            # The shape first: a flat observation (the trading env's, whose preset turns
            # regime_conditional on) is told it is no image, not about a setting it never gave.
            conv = ConvTorso((obs_dim,) if obs_shape is None else obs_shape, act)
            if self.n_regimes:  # regimes are flat entries beside the features; images have none
                raise ConfigError(
                    "regime_conditional must be false with torso 'cnn', got: true (the regime "
                    "probabilities are flat observation entries, an image has none)"
                )
            layers.append(conv)
            width = conv.out_features
        for h in hp.hidden_sizes:
            narrow = not layers and width in INPUT_MAJOR_WIDTHS
            layers += [InputMajorLinear(width, h) if narrow else nn.Linear(width, h), act()]
            width = h
        self.torso = nn.Sequential(*layers)

        def head(out: int) -> nn.Module:
            if hp.noisy_nets:
                return NoisyLinear(width, out, hp.noisy_sigma0)
            return nn.Linear(width, out)

        # All regime heads live in one wide layer: one matmul instead of K small ones.
        # residual gating adds a shared head (index 0) that every regime's correction builds on.
        self.n_heads = max(1, self.n_regimes) + (self.gating == "residual" and self.n_regimes > 0)
        self.adv_head = head(self.n_heads * n_actions * self.n_out)
        self.value_head = head(self.n_heads * self.n_out) if self.dueling else None
        if self.gating == "residual" and self.n_regimes > 0:
            self._zero_regime_corrections()
        if hp.distributional == "c51":
            self.register_buffer("support", _c51_support(hp.v_min, hp.v_max, hp.n_atoms))
        else:
            self.support = None

    @torch.no_grad()
    def _zero_regime_corrections(self) -> None:
        """Start every per-regime correction at zero, so the network begins as the plain one.

        With random corrections each regime starts with its own random action preferences, which
        the weak per-bar signal of a market then has to unlearn; on the synthetic market two agent
        seeds of ten never did (BENCHMARKS.md, section 6). Zero output weights still receive
        gradients (through the regime probabilities), so the corrections grow only where the data
        asks for them. Noisy layers keep their noise scale: exploration stays per regime.
        """
        shared = ((self.adv_head, self.n_actions * self.n_out), (self.value_head, self.n_out))
        for layer, rows in shared:
            if layer is None:
                continue
            weight = layer.weight_mu if isinstance(layer, NoisyLinear) else layer.weight
            bias = layer.bias_mu if isinstance(layer, NoisyLinear) else layer.bias
            weight[rows:].zero_()
            bias[rows:].zero_()

    def head_outputs(self, h: torch.Tensor) -> torch.Tensor:
        """Every head's output ``[B, K, A, N]`` from torso features (dueling combined per head)."""
        b, k = h.shape[0], self.n_heads
        out = self.adv_head(h).view(b, k, self.n_actions, self.n_out)
        if self.value_head is not None:
            value = self.value_head(h).view(b, k, 1, self.n_out)
            out = value + out - out.mean(dim=2, keepdim=True)
        return out

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Raw head output: ``[B, A]`` (scalar) or ``[B, A, N]`` (C51 logits / quantiles)."""
        obs = obs.flatten(1).float() if obs.dim() > 2 else obs.float()
        torso_in = obs if self.torso_inputs is None else obs[:, : self.torso_inputs]
        h = self.torso(torso_in)
        if self.n_regimes == 0 and self.n_out == 1:
            # One scalar head: head_outputs' [B, 1, A, 1] view reshaped back, without the three
            # view ops (what acting on one observation spends its time on, besides the matmuls).
            adv = self.adv_head(h)
            if self.value_head is None:
                return adv
            return self.value_head(h) + adv - adv.mean(dim=1, keepdim=True)
        out = self.head_outputs(h)
        if self.n_regimes == 0:
            out = out[:, 0]
        else:
            probs = obs[:, -self.n_regimes :]
            if self.gating == "hard":
                probs = F.one_hot(probs.argmax(dim=1), self.n_regimes)
            weights = probs.to(out.dtype)[:, :, None, None]
            if self.gating == "residual":
                out = out[:, 0] + (weights * out[:, 1:]).sum(dim=1)
            else:
                out = (weights * out).sum(dim=1)
        return out.squeeze(-1) if self.n_out == 1 else out

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        """Expected Q-values ``[B, A]`` from :meth:`forward` output."""
        if self.distributional == "c51":
            return (out.float().softmax(dim=-1) * self.support).sum(dim=-1)
        if self.distributional == "qr":
            return out.float().mean(dim=-1)
        return out.float()

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Resample the noise of every noisy layer."""
        for m in self.modules():
            if isinstance(m, NoisyLinear):
                m.reset_noise(generator)

    @property
    def is_noisy(self) -> bool:
        """Whether any layer is noisy (cached: asked on every optimizer step)."""
        if not hasattr(self, "_is_noisy"):
            self._is_noisy = any(isinstance(m, NoisyLinear) for m in self.modules())
        return self._is_noisy


class RegimeConditionalDQN(QNetwork):
    """A :class:`QNetwork` with one head per market regime over a shared torso.

    The regime estimate is read from the last ``n_regimes`` observation entries (TradingEnv puts
    its causal regime probabilities there). Every other switch (dueling, C51/QR, noisy nets) stays
    available through ``hp``.
    """

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        n_regimes: int,
        hp: DQNHyperparameters | None = None,
    ) -> None:
        hp = (hp or DQNHyperparameters()).replace(regime_conditional=True)
        super().__init__(obs_dim, n_actions, hp, n_regimes=n_regimes)
