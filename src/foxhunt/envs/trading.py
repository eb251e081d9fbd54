"""A single-asset trading environment with explicit, look-ahead-free accounting.

Timing convention (the one rule everything else follows): at bar ``t`` the agent sees data up to
and including bar ``t``'s close, picks a *target position*, is filled at ``close[t]`` and earns
``close[t+1] / close[t]`` on it. Changing position costs
``|new - old| * (cost_bps + slippage_bps) / 1e4`` of equity, paid at the fill. The reward is the
log growth of equity over the bar, net of that cost::

    reward_t = log((1 - cost_t) * (1 + position_t * (close[t+1] / close[t] - 1)))

Rewards are log returns so an episode's rewards sum to the log of its final equity, and the
backtest (:mod:`foxhunt.backtest`) uses the very same :func:`step_growth` so that a policy run
through this env and a position series simulated there are accounted identically.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

import gymnasium as gym
import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from foxhunt.config import did_you_mean, python_scalars, shown
from foxhunt.errors import ConfigError, DataError, EnvironmentStepError
from foxhunt.markets.arrays import MarketArrays

MAX_LEVERAGE = 5.0
"""Largest |target position| allowed; beyond it one bar's move can wipe out the account."""

BANKRUPTCY_REWARD = -10.0
"""Reward for a step that wipes the equity out: the episode terminates.

A log return is undefined at growth 0; -10 (equity x 4.5e-5) is finite, so TD targets stay
bounded. Reported equity becomes exactly 0.
"""

WIPEOUT_GROWTH = math.exp(BANKRUPTCY_REWARD)
"""One bar's equity growth at or below which the account counts as wiped out. A leveraged bar
can keep a sliver of equity (2 x a 49.9999% fall keeps 2e-6): its log return (-13) would be a
worse reward than bankruptcy's -10, so an agent would be paid for going bust instead. Treating
such a bar as the wipe-out it nearly is keeps every survivable bar's reward above -10."""


def _one_line(exc: ValidationError, model: str) -> str:
    """Pydantic's multi-line report squeezed into the one line the CLI prints."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(model)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            hint = did_you_mean(loc, TradingEnvConfig.model_fields)
            parts.append(f"unknown setting '{model}.{loc}' (value {shown(err.get('input'))}){hint}")
            continue
        if err["type"] in ("tuple_type", "list_type"):
            msg = "must be a list such as [0.0, 1.0]"
        elif err["type"] in ("bool_type", "bool_parsing"):
            msg = "must be true or false"
        parts.append(f"{model}.{loc}: {msg} (got {shown(err.get('input'))})")
    return "; ".join(parts)


class TradingEnvConfig(BaseModel):
    """How the trading env builds observations, charges costs and cuts episodes."""

    # Numbers are strict: a lax int/float would silently take YAML's ``true`` as 1.
    model_config = ConfigDict(extra="forbid", frozen=True)

    window: Annotated[int, Strict()] = Field(32, ge=1)
    """Bars of features in each observation (the current bar and ``window - 1`` before it)."""
    positions: tuple[Annotated[float, Strict()], ...] = (-1.0, 0.0, 1.0)
    """Target positions (fraction of equity) the discrete actions index; (0.0, 1.0) = long-only."""
    cost_bps: Annotated[float, Strict()] = Field(1.0, ge=0.0, le=1e4, allow_inf_nan=False)
    """Commission per unit of position changed, in basis points of equity."""
    slippage_bps: Annotated[float, Strict()] = Field(1.0, ge=0.0, le=1e4, allow_inf_nan=False)
    """Slippage per unit of position changed, in basis points; charged exactly like cost."""
    episode_length: Annotated[int, Strict()] | None = Field(256, ge=1)
    """Steps per training episode; None (or longer than the span) = the whole span."""
    random_start: bool = True
    """Training episodes start at a random bar (seeded by ``reset(seed=...)``); else the first."""
    initial_position: Annotated[int, Strict()] | None = None
    """Index into ``positions`` held before the first step; None = flat (or the smallest |p|)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**python_scalars(data))
        except ValidationError as exc:
            # Named as users set it: trading.window (--set, config files), not the class.
            raise ConfigError(_one_line(exc, "trading")) from None

    @field_validator("positions")
    @classmethod
    def _check_positions(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if len(value) == 0:
            raise ValueError("needs at least one target position")
        for p in value:
            if not math.isfinite(p) or abs(p) > MAX_LEVERAGE:
                raise ValueError(f"position {p!r} must be finite with |p| <= {MAX_LEVERAGE}")
        if len(set(value)) != len(value):
            raise ValueError("positions must be distinct")
        return tuple(float(p) for p in value)

    @field_validator("initial_position")
    @classmethod
    def _check_initial_position(cls, value: int | None, info: ValidationInfo) -> int | None:
        positions = info.data.get("positions")
        if value is not None and positions is not None and not 0 <= value < len(positions):
            raise ValueError(f"must be an index into positions (0..{len(positions) - 1})")
        return value

    def check_new(self) -> None:
        """Checks for a new run's settings only (a run directory recorded before them must
        still load): costs that take all the equity on one trade."""
        widest = max(self.positions) - min(self.positions)
        if widest * self.cost_rate >= 1.0:
            raise ConfigError(
                f"trading: cost_bps + slippage_bps = {self.cost_bps + self.slippage_bps:g} bps "
                f"charges {widest * self.cost_rate:.0%} of equity for the widest position "
                f"change ({widest:g}): one trade would wipe the account out"
            )

    @property
    def cost_rate(self) -> float:
        """Fraction of equity paid per unit of position changed."""
        return (self.cost_bps + self.slippage_bps) / 1e4

    @property
    def initial_index(self) -> int:
        """Resolved starting position index: explicit, else flat, else the smallest |p| (first)."""
        if self.initial_position is not None:
            return self.initial_position
        return min(range(len(self.positions)), key=lambda i: abs(self.positions[i]))

    @property
    def initial_value(self) -> float:
        """The starting position itself (fraction of equity)."""
        return self.positions[self.initial_index]

    @property
    def neutral_value(self) -> float:
        """The position a baseline holds where it has no view: the one nearest flat. Where two
        are equally near (long/short only, ``(-1, 1)``), the starting position if it is one of
        them, so the baseline does not pay to leave it; else the first listed."""
        nearest = min(abs(p) for p in self.positions)
        tied = [p for p in self.positions if abs(p) == nearest]
        return self.initial_value if self.initial_value in tied else tied[0]


def step_growth(old: Any, new: Any, market_return: Any, cost_rate: float) -> tuple[Any, Any]:
    """(cost, gross equity growth) of moving ``old -> new`` and holding over one bar.

    Works on floats or numpy arrays alike so the env and the vectorised backtest share one
    formula. ``growth <= 0`` means the account is wiped out (see :data:`BANKRUPTCY_REWARD`): that
    happens when the cost takes all equity *or* the bar's move does (to within
    :data:`WIPEOUT_GROWTH`), and the growth is then exactly 0. The product of the two factors
    alone would not say so: a cost above equity (factor < 0) times a move that also wipes the
    position out (factor < 0) is positive.
    """
    cost = abs(new - old) * cost_rate
    keep = 1.0 - cost  # equity left after paying the cost
    gross = 1.0 + new * market_return  # growth of what is left over the bar
    growth = keep * gross
    if np.ndim(growth) == 0:
        return cost, (growth if keep > 0.0 and gross > 0.0 and growth > WIPEOUT_GROWTH else 0.0)
    alive = (keep > 0.0) & (gross > 0.0) & (growth > WIPEOUT_GROWTH)
    return cost, np.where(alive, growth, 0.0)


def validate_market(market: MarketArrays, window: int) -> None:
    """Raise DataError/ConfigError if ``market`` cannot drive a TradingEnv with ``window``."""
    if not isinstance(market, MarketArrays):
        raise DataError(
            f"TradingEnv takes MarketArrays, got {type(market).__name__}: build them with "
            "foxhunt.prepare_market(df, train_end=N), which fits the feature normalisation and "
            "the regime detector on the first N rows only"
        )
    n = len(market)
    if n < window + 2:
        raise ConfigError(
            f"window: market span has {n} bars but window={window} needs at least "
            f"{window + 2} (window + 2)"
        )
    close = np.asarray(market.close)
    if close.ndim != 1:
        raise DataError(f"close: expected a 1-d array, got shape {close.shape}")
    bad = np.flatnonzero(~np.isfinite(close) | (close <= 0))
    if bad.size:
        raise DataError(f"close: row {bad[0]} is {close[bad[0]]!r}; prices must be finite and > 0")
    with np.errstate(over="ignore"):
        jumps = np.flatnonzero(~np.isfinite(close[1:] / close[:-1]))
    if jumps.size:
        i = int(jumps[0]) + 1
        raise DataError(
            f"close: row {i} ({close[i]!r}) over row {i - 1} ({close[i - 1]!r}) is a move too "
            "large for a float; the bar's return cannot be computed"
        )
    for name, arr in (("features", market.features), ("regime_probs", market.regime_probs)):
        arr = np.asarray(arr)
        if arr.ndim != 2 or arr.shape[0] != n:
            raise DataError(f"{name}: expected shape [{n}, *], got {arr.shape}")
        bad_rows = np.flatnonzero(~np.isfinite(arr).all(axis=1))
        if bad_rows.size:
            raise DataError(f"{name}: row {bad_rows[0]} holds a non-finite value")
    probs = np.asarray(market.regime_probs)
    if probs.size and (probs.min() < -1e-5 or probs.max() > 1 + 1e-5):
        raise DataError(
            f"regime_probs: values must lie in [0, 1], got range "
            f"[{probs.min():.6g}, {probs.max():.6g}]"
        )
    if len(market.timestamps) != n:
        raise DataError(f"timestamps: length {len(market.timestamps)} != {n} bars of close")


def timestamp_ns(value: Any) -> int:
    """A bar's timestamp as int nanoseconds since the epoch (plain ints pass through)."""
    if isinstance(value, np.datetime64):
        return int(value.astype("datetime64[ns]").astype(np.int64))
    return int(value)


class TradingEnv(gym.Env[np.ndarray, np.int64]):
    """Trade one asset by choosing a target position from ``config.positions`` each bar.

    Observation (float32), in this order::

        features[t - window + 1 .. t].ravel()  |  one-hot(current position)  |  regime_probs[t]

    The regime probabilities are deliberately the *last* ``n_regimes`` entries
    (``obs[env.regime_slice]``) so a regime-conditional Q-network can read them from there.

    Training mode: episodes of ``episode_length`` steps from a random bar (``np_random``, seeded
    via ``reset(seed=...)``), ending with ``truncated=True`` (a time limit, not a terminal state).
    ``eval_mode``: one episode from the first bar with a full window to the last bar, ending with
    ``terminated=True``. Either way a wiped-out account ends the episode with ``terminated=True``.
    No exit cost is charged when an episode ends with an open position.

    ``info`` (reset and step): ``bar`` (the decision bar ``t`` the step was filled at),
    ``timestamp`` (bar ``t`` in int ns), ``position`` / ``position_index`` (held after the step),
    ``equity`` (after the step, start 1.0); step adds ``cost``, ``portfolio_return`` (net simple
    return of the bar), ``market_return`` (``close[t+1]/close[t] - 1``) and ``bankrupt``.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute convention

    def __init__(
        self,
        market: MarketArrays,
        config: TradingEnvConfig | Mapping[str, Any] | None = None,
        *,
        eval_mode: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(config, Mapping):  # {"cost_bps": 2}: the fields, validated as ever
            odd = [k for k in config if not isinstance(k, str)]
            if odd:
                raise ConfigError(f"config keys must be field names, got: {odd[0]!r}")
            config = TradingEnvConfig(**config)
        elif config is not None and not isinstance(config, TradingEnvConfig):
            raise ConfigError(
                f"config must be a TradingEnvConfig or a mapping of its fields, got: "
                f"{type(config).__name__}"
            )
        self.config = config if config is not None else TradingEnvConfig()
        self.eval_mode = eval_mode
        validate_market(market, self.config.window)
        self.market = market
        self._close = np.asarray(market.close, dtype=np.float64)
        self._features = np.ascontiguousarray(market.features, dtype=np.float32)
        self._regimes = np.clip(np.asarray(market.regime_probs, dtype=np.float32), 0.0, 1.0)
        self._timestamps = np.asarray(market.timestamps)

        self.positions: tuple[float, ...] = self.config.positions
        self.n_positions = len(self.positions)
        self.n_features = int(self._features.shape[1])
        self.n_regimes = int(self._regimes.shape[1])
        # Vector envs copy their first env's metadata: the trainer reads the regime count there,
        # never through get_attr (which breaks an AsyncVectorEnv over envs that lack it).
        self.metadata = {**type(self).metadata, "n_regimes": self.n_regimes}
        self.window = self.config.window
        n_window = self.window * self.n_features
        self.obs_dim = n_window + self.n_positions + self.n_regimes
        self.feature_slice = slice(0, n_window)
        self.position_slice = slice(n_window, n_window + self.n_positions)
        self.regime_slice = slice(n_window + self.n_positions, self.obs_dim)

        big = np.finfo(np.float32).max  # finite bounds: features are unbounded but finite
        low = np.zeros(self.obs_dim, dtype=np.float32)
        high = np.ones(self.obs_dim, dtype=np.float32)
        low[self.feature_slice], high[self.feature_slice] = -big, big
        self.observation_space = gym.spaces.Box(low=low, high=high, dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.n_positions)

        self.first_bar = self.window - 1  # first bar with a full feature window
        self.last_bar = len(self._close) - 1  # no return is earned after it
        self.max_steps = self.last_bar - self.first_bar
        if eval_mode or self.config.episode_length is None:
            self.episode_length = self.max_steps
        else:  # a span shorter than one episode is used whole rather than rejected
            self.episode_length = min(self.config.episode_length, self.max_steps)
        self._cost_rate = self.config.cost_rate
        self._t = -1
        self._steps = 0
        self._pos_index = self.config.initial_index
        self._equity = 1.0
        self._done = True

    # -- helpers ------------------------------------------------------------------------------
    def observation(self) -> np.ndarray:
        """The observation at the current bar and position: after :meth:`set_state`, the one
        for any bar and position, without stepping there (``foxhunt.next_position``)."""
        return self._observation()

    @property
    def bar(self) -> int:
        """The current bar (the one the next action is decided at)."""
        return self._t

    @property
    def position_index(self) -> int:
        """The index of the position held into the current bar."""
        return self._pos_index

    def observations(self, first: int, stop: int, position_index: int) -> np.ndarray:
        """``[stop - first, obs_dim]``: the observations at bars ``first..stop-1`` holding
        ``position_index``, value for value those :meth:`observation` gives one at a time, so a
        policy can be run on many bars at once (the backtest's batched greedy actions)."""
        if not self.first_bar <= first <= stop <= self.last_bar + 1:
            raise ValueError(
                f"bars {first}..{stop - 1} are outside {self.first_bar}..{self.last_bar}"
            )
        if not 0 <= position_index < self.n_positions:
            raise ValueError(
                f"position_index must be in 0..{self.n_positions - 1}, got {position_index}"
            )
        n = stop - first
        out = np.zeros((n, self.obs_dim), dtype=np.float32)
        if n == 0:
            return out
        rows = self._features[first - self.window + 1 : stop]
        # [n, n_features, window] -> [n, window, n_features]: each bar's window, row-major.
        windows = np.lib.stride_tricks.sliding_window_view(rows, self.window, axis=0)
        out[:, self.feature_slice] = windows.transpose(0, 2, 1).reshape(n, -1)
        out[:, self.position_slice.start + position_index] = 1.0
        out[:, self.regime_slice] = self._regimes[first:stop]
        return out

    def _observation(self) -> np.ndarray:
        t = self._t
        obs = np.empty(self.obs_dim, dtype=np.float32)
        obs[self.feature_slice] = self._features[t - self.window + 1 : t + 1].ravel()
        one_hot = obs[self.position_slice]
        one_hot[:] = 0.0
        one_hot[self._pos_index] = 1.0
        obs[self.regime_slice] = self._regimes[t]
        return obs

    def _info(self, t: int) -> dict[str, Any]:
        return {
            "bar": t,
            "timestamp": timestamp_ns(self._timestamps[t]),
            "position": self.positions[self._pos_index],
            "position_index": self._pos_index,
            "equity": self._equity,
        }

    # -- exact resume -------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The episode's dynamic state as JSON, so a resumed run continues mid-episode exactly
        (:mod:`foxhunt.envstate` adds the env's RNG; the market itself is rebuilt from config)."""
        return {
            "t": self._t,
            "steps": self._steps,
            "position_index": self._pos_index,
            "equity": self._equity,
            "done": self._done,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s output; checked completely before anything is set (the
        state comes from a checkpoint file)."""
        from foxhunt.errors import CheckpointError

        keys = {"t", "steps", "position_index", "equity", "done"}
        if not isinstance(state, dict) or set(state) != keys:
            raise CheckpointError(
                f"checkpoint trading env state must have keys {sorted(keys)}, got: {state!r:.80}"
            )

        def integer(name: str, lo: int, hi: int) -> int:
            value = state[name]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise CheckpointError(
                    f"checkpoint trading env state {name} must be an integer in {lo}..{hi}, "
                    f"got: {value!r:.60}"
                )
            return value

        t = integer("t", -1, self.last_bar)
        steps = integer("steps", 0, self.max_steps)
        position = integer("position_index", 0, self.n_positions - 1)
        equity, done = state["equity"], state["done"]
        if (
            isinstance(equity, bool)
            or not isinstance(equity, int | float)
            or not (math.isfinite(equity) and equity >= 0.0)
        ):
            raise CheckpointError(
                f"checkpoint trading env state equity must be a finite number >= 0, got: "
                f"{equity!r:.60}"
            )
        if not isinstance(done, bool):
            raise CheckpointError(
                f"checkpoint trading env state done must be a bool, got: {done!r}"
            )
        self._t, self._steps, self._pos_index = t, steps, position
        self._equity, self._done = float(equity), done

    # -- gymnasium API ------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; ``options={"start": bar}`` pins the first bar (training mode only)."""
        super().reset(seed=seed)
        latest_start = self.last_bar - self.episode_length
        if options and options.get("start") is not None:
            start = int(options["start"])
            if self.eval_mode or not self.first_bar <= start <= latest_start:
                raise ConfigError(
                    f"reset options.start: {start} outside {self.first_bar}..{latest_start} "
                    f"(eval_mode={self.eval_mode})"
                )
        elif self.eval_mode or not self.config.random_start:
            start = self.first_bar
        else:
            start = int(self.np_random.integers(self.first_bar, latest_start + 1))
        self._t = start
        self._steps = 0
        self._pos_index = self.config.initial_index
        self._equity = 1.0
        self._done = False
        return self._observation(), self._info(start)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("TradingEnv.step called before reset() or after the episode ended")
        a = np.asarray(action)
        if a.size != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"action: expected one integer index, got {action!r}")
        index = int(a.reshape(()))
        if not 0 <= index < self.n_positions:
            raise ValueError(f"action: {index} is not in 0..{self.n_positions - 1}")

        t = self._t
        old = self.positions[self._pos_index]
        new = self.positions[index]
        market_return = self._close[t + 1] / self._close[t] - 1.0
        cost, growth = step_growth(old, new, market_return, self._cost_rate)
        self._pos_index = index
        self._t = t + 1
        self._steps += 1
        bankrupt = growth <= 0.0
        if bankrupt:
            reward = BANKRUPTCY_REWARD
            self._equity = 0.0
        else:
            reward = math.log(growth)
            self._equity *= growth
        if not math.isfinite(reward):
            raise EnvironmentStepError(f"reward at bar {t} is {reward!r} (growth {growth!r})")

        at_data_end = self._t >= self.last_bar
        if self.eval_mode:
            terminated, truncated = bankrupt or at_data_end, False
        else:
            terminated = bankrupt
            truncated = not bankrupt and self._steps >= self.episode_length
        self._done = terminated or truncated

        info = self._info(t)
        info.update(
            cost=float(cost),
            portfolio_return=float(growth - 1.0),
            market_return=float(market_return),
            bankrupt=bool(bankrupt),
        )
        return self._observation(), float(reward), bool(terminated), bool(truncated), info

    def counterfactual_transitions(
        self,
        obs: np.ndarray,
        action: int,
        next_obs: np.ndarray,
        terminated: bool,
        info: dict[str, Any],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The transitions of the actions *not* taken at the same bar: (actions, rewards,
        next observations, terminated).

        Prices do not react to a single agent's position, so every other target position would
        have seen the same ``market_return`` and differed only in its position, cost and equity
        growth; its next observation is ``next_obs`` with the position one-hot changed. Storing
        them (``action_augmentation``) trains every action's Q-value on each market move, which
        removes the market noise from the comparison between actions. ``info`` is the step's info
        for this env (for an ended episode, its final info).
        """
        positions = np.asarray(self.positions)
        held = float(positions @ np.asarray(obs, dtype=np.float64)[self.position_slice])
        others = np.array([a for a in range(self.n_positions) if a != int(action)], dtype=np.int64)
        _, growth = step_growth(
            held, positions[others], float(info["market_return"]), self._cost_rate
        )
        bankrupt = growth <= 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            rewards = np.where(bankrupt, BANKRUPTCY_REWARD, np.log(np.where(bankrupt, 1.0, growth)))
        nxt = np.repeat(np.asarray(next_obs, dtype=np.float32)[None], len(others), axis=0)
        nxt[:, self.position_slice] = 0.0
        nxt[np.arange(len(others)), self.position_slice.start + others] = 1.0
        # The taken action's termination that was not bankruptcy (the end of the data in
        # eval_mode) ends the alternatives too.
        data_end = bool(terminated) and not bool(info.get("bankrupt", False))
        return others, rewards.astype(np.float64), nxt, bankrupt | data_end
