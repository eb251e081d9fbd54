"""Environment state as JSON, so a resumed run continues mid-episode exactly.

An environment can opt in by defining ``get_state() -> dict`` and ``set_state(dict)`` (foxhunt's
TradingEnv does). Gymnasium's classic-control envs are covered generically: their whole dynamic
state is the ``state`` array, ``steps_beyond_terminated``, the env's ``np_random`` and the
``TimeLimit`` wrapper's step counter. Other envs are reported as not capturable; the trainer then
resumes them from a fresh reset and says so.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

_WRAPPER_ATTRS = ("_elapsed_steps", "_has_reset", "_disable_render_order_enforcing")
_BASE_ATTRS = ("state", "steps_beyond_terminated", "steps_beyond_done")


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {
            "__ndarray__": value.tolist(),
            "dtype": str(value.dtype),
            "shape": list(value.shape),
        }
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=value["dtype"]).reshape(value["shape"])
    if isinstance(value, dict) and "__tuple__" in value:
        return tuple(_decode(v) for v in value["__tuple__"])
    return value


def _chain(env: gym.Env) -> list[gym.Env]:
    out = [env]
    while isinstance(out[-1], gym.Wrapper):
        out.append(out[-1].env)
    return out


def get_env_state(env: gym.Env) -> dict[str, Any] | None:
    """JSON-able dynamic state of ``env`` (wrappers included), or None if it cannot be captured."""
    chain = _chain(env)
    base = chain[-1]
    wrappers = [
        {a: _encode(getattr(w, a)) for a in _WRAPPER_ATTRS if hasattr(w, a)} for w in chain[:-1]
    ]
    if hasattr(base, "get_state") and callable(base.get_state):
        base_state: dict[str, Any] = {"custom": base.get_state()}
    else:
        attrs = {a: _encode(getattr(base, a)) for a in _BASE_ATTRS if hasattr(base, a)}
        if "state" not in attrs:
            return None
        base_state = {"attrs": attrs}
    rng = getattr(base, "_np_random", None)
    base_state["np_random"] = None if rng is None else rng.bit_generator.state
    return {"wrappers": wrappers, "base": base_state}


def set_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Restore what :func:`get_env_state` captured."""
    chain = _chain(env)
    base = chain[-1]
    for w, attrs in zip(chain[:-1], state["wrappers"], strict=True):
        for k, v in attrs.items():
            setattr(w, k, _decode(v))
    b = state["base"]
    if b.get("np_random") is not None:
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = b["np_random"]
        base._np_random = rng  # type: ignore[attr-defined]
    if "custom" in b:
        base.set_state(b["custom"])  # type: ignore[attr-defined]
    else:
        for k, v in b["attrs"].items():
            setattr(base, k, _decode(v))


def get_vector_env_state(envs: gym.vector.VectorEnv) -> list[dict[str, Any]] | None:
    """States of every sub-env of a SyncVectorEnv (None if any cannot be captured)."""
    subs = getattr(envs, "envs", None)
    if subs is None:
        return None
    states = [get_env_state(e) for e in subs]
    return None if any(s is None for s in states) else states  # type: ignore[return-value]


def set_vector_env_state(envs: gym.vector.VectorEnv, states: list[dict[str, Any]]) -> None:
    for e, s in zip(envs.envs, states, strict=True):  # type: ignore[attr-defined]
        set_env_state(e, s)
