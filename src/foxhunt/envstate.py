"""Environment state as JSON, so a resumed run continues mid-episode exactly.

An environment can opt in by defining ``get_state() -> dict`` and ``set_state(dict)`` (foxhunt's
TradingEnv does). Gymnasium's own classic-control and toy-text envs are covered generically:
their whole dynamic state is the ``state`` array (``s`` for toy text),
``steps_beyond_terminated``, the env's ``np_random`` and the ``TimeLimit`` wrapper's step
counter. Other envs are reported as not capturable; the trainer then resumes them from a fresh
reset and says so.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

_WRAPPER_ATTRS = ("_elapsed_steps", "_has_reset", "_disable_render_order_enforcing")
# Classic control keeps its dynamics in ``state``; toy text (FrozenLake, Taxi, CliffWalking) in
# ``s`` and ``lastaction`` (and a fickle Taxi passenger's ``fickle_step``).
_BASE_ATTRS = (
    "state",
    "s",
    "lastaction",
    "fickle_step",
    "steps_beyond_terminated",
    "steps_beyond_done",
)
# Only Gymnasium's own envs are known to keep nothing else: a user's env with a ``state``
# attribute may also count steps or hold a position, which a resume would silently lose.
_KNOWN_MODULES = ("gymnasium.envs.classic_control.", "gymnasium.envs.toy_text.")


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


_MARKS = ("__npscalar__", "__ndarray__", "__dict__")


def _plain_dtype(dtype: np.dtype) -> bool:
    """Booleans, integers and floats of up to 64 bits: what JSON numbers hold exactly."""
    return dtype.kind in "biuf" and dtype.itemsize <= 8


def _encode_custom(value: Any, where: str, _open: frozenset[int] = frozenset()) -> Any:
    """An env's own ``get_state()`` output as JSON: NumPy numeric arrays and scalars are tagged
    with their dtype (so ``set_state`` gets back what it gave, and a resume stays bitwise), and a
    dict whose keys look like such a tag is wrapped so that it stays a dict. Anything JSON cannot
    hold is refused here, in one line naming where it sits, instead of as a traceback from the
    checkpoint writer. A np.float64 is a float and comes back as one, as JSON always wrote it
    (checkpoints that resumed before still compare equal on their round trip)."""
    from foxhunt.errors import EnvironmentStepError

    def refuse(what: str) -> EnvironmentStepError:
        return EnvironmentStepError(
            f"{where} is {what}, which a checkpoint cannot hold: get_state() may return dicts, "
            "lists, strings, numbers, booleans, None and NumPy arrays or scalars of booleans, "
            "integers or floats (up to 64 bits)"
        )

    if isinstance(value, float):
        return float(value)
    if isinstance(value, np.ndarray | np.generic):
        if not _plain_dtype(value.dtype):
            raise refuse(f"a {type(value).__name__} of dtype {value.dtype}")
        if isinstance(value, np.ndarray):
            return _encode(value)
        return {"__npscalar__": value.item(), "dtype": str(value.dtype)}
    if value is None or isinstance(value, str | int | bool):
        return value
    if not isinstance(value, dict | list | tuple):
        raise refuse(f"a {type(value).__name__}")
    if id(value) in _open:
        raise refuse("the container it sits in (it contains itself)")
    inner = _open | {id(value)}
    if isinstance(value, list | tuple):
        return [_encode_custom(v, f"{where}[{i}]", inner) for i, v in enumerate(value)]
    out = {}
    for k, v in value.items():
        # JSON writes int, float, bool and None keys as strings (as checkpoints always did).
        if isinstance(k, np.generic) or not (k is None or isinstance(k, str | int | float)):
            raise refuse(
                f"a dict with the key {k!r:.40} ({type(k).__name__}; keys must be str, int, "
                "float, bool or None)"
            )
        out[k] = _encode_custom(v, f"{where}[{k!r:.40}]", inner)
    return {"__dict__": out} if any(m in out for m in _MARKS) else out


def _decode_custom(value: Any) -> Any:
    """Undo :func:`_encode_custom`; the value comes from a checkpoint file, so a tag with a
    dtype other than a plain number's, or of another shape than its values, is refused."""
    if isinstance(value, dict) and "__dict__" in value and len(value) == 1:
        inner = value["__dict__"]
        if not isinstance(inner, dict):
            raise ValueError(f"a wrapped dict holds {type(inner).__name__}")
        return {k: _decode_custom(v) for k, v in inner.items()}
    tagged = isinstance(value, dict) and set(value) in (
        {"__npscalar__", "dtype"},
        {"__ndarray__", "dtype", "shape"},
    )
    if tagged:
        dtype = np.dtype(value["dtype"]) if isinstance(value["dtype"], str) else None
        if dtype is None or not _plain_dtype(dtype):
            raise ValueError(f"not a plain numeric dtype: {value['dtype']!r:.40}")
        if "__npscalar__" in value:
            number = value["__npscalar__"]
            kinds = {"b": bool, "i": int, "u": int, "f": int | float}[dtype.kind]
            if isinstance(number, bool) != (dtype.kind == "b") or not isinstance(number, kinds):
                raise ValueError(f"{number!r:.40} is not a {dtype} value")
            return dtype.type(number)
        raw = np.asarray(value["__ndarray__"])
        allowed = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}[dtype.kind]
        if raw.size and raw.dtype.kind not in allowed:  # no silent casts: 1.5 is no int64
            raise ValueError(f"{raw.dtype} values under the dtype {dtype}")
        array = raw.astype(dtype)
        shape = value["shape"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"shape {shape!r:.40} is not a list of sizes")
        if array.size == 0 and math.prod(shape) == 0:
            array = array.reshape(shape)  # an empty (0, 3) array is written as []
        if list(array.shape) != shape:
            raise ValueError(f"values of shape {array.shape} under the shape {shape!r:.40}")
        return array
    if isinstance(value, dict):
        return {k: _decode_custom(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_custom(v) for v in value]
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
        where = f"{type(base).__name__}.get_state()"
        base_state: dict[str, Any] = {"custom": _encode_custom(base.get_state(), where)}
    else:
        if not type(base).__module__.startswith(_KNOWN_MODULES):
            return None  # resumed from a fresh reset, as the trainer says
        attrs = {a: _encode(getattr(base, a)) for a in _BASE_ATTRS if hasattr(base, a)}
        if "state" not in attrs and "s" not in attrs:
            return None
        base_state = {"attrs": attrs}
    rng = getattr(base, "_np_random", None)
    base_state["np_random"] = None if rng is None else rng.bit_generator.state
    return {"wrappers": wrappers, "base": base_state}


def _compatible(current: Any, new: Any) -> bool:
    """Whether ``new`` may replace ``current``: same kind of value; arrays of equal shape/dtype."""
    if isinstance(current, np.ndarray | tuple) and isinstance(new, np.ndarray | tuple):
        # Classic control changes a state's container between reset and step: Acrobot's is
        # float32 after reset and float64 after a step, MountainCar's an array after reset and
        # a tuple after a step. The saved value is what the env held then: restore it as it
        # was, checked for the same number of plain numbers.
        try:
            cur, got = np.asarray(current), np.asarray(new)
        except (TypeError, ValueError):
            return False
        return (
            cur.shape == got.shape
            and cur.dtype.kind in "biuf"
            and got.dtype.kind in "biuf"
            and (got.dtype.kind == "f") == (cur.dtype.kind == "f")
        )
    if isinstance(current, np.ndarray):
        return False
    if isinstance(current, bool) or isinstance(new, bool):
        return type(current) is type(new)
    numeric = (int, float, np.integer, np.floating)
    if current is None or isinstance(current, numeric):
        # Counters such as ``_elapsed_steps`` or ``steps_beyond_terminated`` are None until set.
        return new is None or isinstance(new, numeric)
    return type(new) is type(current)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} {value.dtype}"
    return f"a {type(value).__name__}"


def set_env_state(env: gym.Env, state: dict[str, Any], *, where: str = "env") -> None:
    """Restore what :func:`get_env_state` captured, into an env that has been reset once.

    The state comes from a checkpoint file, so it is checked completely before anything is set:
    only the attributes :func:`get_env_state` writes, each of the same kind (arrays: same shape and
    dtype) as the env's own value. A malformed state raises :class:`CheckpointError` naming the
    attribute and leaves the env unchanged, instead of crashing inside ``env.step`` later.
    """
    from foxhunt.errors import CheckpointError

    def fail(field: str, message: str) -> CheckpointError:
        name = f"{where}.{field}" if field else where
        return CheckpointError(f"checkpoint environment state {name} {message}")

    chain = _chain(env)
    base = chain[-1]
    if not isinstance(state, dict) or set(state) != {"wrappers", "base"}:
        raise fail("", f"must have keys ['base', 'wrappers'], got: {state!r:.80}")
    wrappers, b = state["wrappers"], state["base"]
    if not isinstance(wrappers, list) or len(wrappers) != len(chain) - 1:
        raise fail("wrappers", f"must list {len(chain) - 1} wrappers, got: {wrappers!r:.80}")
    if not isinstance(b, dict) or set(b) not in ({"attrs", "np_random"}, {"custom", "np_random"}):
        raise fail("base", f"must have keys attrs/custom and np_random, got: {b!r:.80}")
    plan: list[tuple[Any, str, Any]] = []
    targets = [
        (w, attrs, _WRAPPER_ATTRS, f"wrappers[{i}]")
        for i, (w, attrs) in enumerate(zip(chain[:-1], wrappers, strict=True))
    ]
    if "attrs" in b:
        targets.append((base, b["attrs"], _BASE_ATTRS, "base"))
    for obj, attrs, allowed, label in targets:
        if not isinstance(attrs, dict):
            raise fail(label, f"must be a mapping, got: {attrs!r:.80}")
        for k, raw in attrs.items():
            if k not in allowed or not hasattr(obj, k):
                raise fail(f"{label}.{k}", f"is not restorable (value {raw!r:.60})")
            try:
                value = _decode(raw)
            except (TypeError, ValueError, KeyError, OverflowError) as err:
                raise fail(f"{label}.{k}", f"is malformed ({err}): {raw!r:.80}") from None
            current = getattr(obj, k)
            if not _compatible(current, value):
                raise fail(
                    f"{label}.{k}",
                    f"must be {_describe(current)}, got: {_describe(value)} {raw!r:.80}",
                )
            plan.append((obj, k, value))
    rng = None
    if b["np_random"] is not None:
        rng = np.random.Generator(np.random.PCG64())
        try:
            rng.bit_generator.state = b["np_random"]
        except (TypeError, ValueError, KeyError, OverflowError) as err:
            raise fail("base.np_random", f"is malformed ({err})") from None
    try:
        custom = _decode_custom(b["custom"]) if "custom" in b else None
    except (TypeError, ValueError, KeyError, OverflowError, MemoryError) as err:
        raise fail("base.custom", f"is malformed ({str(err)[:120]})") from None
    # Everything checked: apply (a custom env validates its own state in ``set_state``).
    if "custom" in b:
        base.set_state(custom)  # type: ignore[attr-defined]
    if rng is not None:
        base._np_random = rng  # type: ignore[attr-defined]
    for obj, k, value in plan:
        setattr(obj, k, value)


def get_vector_env_state(envs: gym.vector.VectorEnv) -> list[dict[str, Any]] | None:
    """States of every sub-env of a SyncVectorEnv (None if any cannot be captured)."""
    subs = getattr(envs, "envs", None)
    if subs is None:
        return None
    states = [get_env_state(e) for e in subs]
    return None if any(s is None for s in states) else states  # type: ignore[return-value]


def set_vector_env_state(envs: gym.vector.VectorEnv, states: list[dict[str, Any]]) -> None:
    """Restore every sub-env's state (checked first: the count must match the run's envs)."""
    from foxhunt.errors import CheckpointError

    subs = envs.envs  # type: ignore[attr-defined]
    if not isinstance(states, list) or len(states) != len(subs):
        got = len(states) if isinstance(states, list) else type(states).__name__
        raise CheckpointError(
            f"checkpoint holds states for {got} environments, the run has {len(subs)}"
        )
    for i, (e, s) in enumerate(zip(subs, states, strict=True)):
        set_env_state(e, s, where=f"envs[{i}]")
