"""The trainer's whole state as tensors and JSON, and its all-or-nothing restore (exact resume).

:func:`capture_state` collects everything a resumed run needs: networks, optimizer, replay,
partial n-step returns, RNGs, environment state and loop counters. :func:`restore_state` loads
it into a freshly built trainer of the same spec. A checkpoint is untrusted input, so every field
and tensor is checked against the fresh trainer's own before anything is applied, and the
trainer is captured again afterwards: it must reproduce the checkpoint bit for bit.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from foxhunt.config import DQNHyperparameters
from foxhunt.errors import CheckpointError
from foxhunt.health import NEWER_FIELDS as NEWER_HEALTH_FIELDS
from foxhunt.learner import LEARNER_PATHS
from foxhunt.networks import stored_transposed
from foxhunt.replay import PrioritizedReplayBuffer
from foxhunt.trainer import DQNTrainer, MetricsWindow

log = logging.getLogger("foxhunt.trainer")


def _encode_np_global() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "name": name,
        "keys": keys.tolist(),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _decode_np_global(s: dict[str, Any]) -> None:
    np.random.set_state(
        (s["name"], np.asarray(s["keys"], dtype=np.uint32), s["pos"], s["has_gauss"], s["cached"])
    )


def capture_state(trainer: DQNTrainer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Everything a resumed run needs: tensors (safetensors) and the rest (JSON).

    The tensors are not copies: on CPU most of them share storage with the live networks,
    optimizer and replay (a checkpoint writer copies them once, when it serialises). Clone them
    to keep a snapshot across further training.
    """
    import random

    from foxhunt.envstate import get_vector_env_state

    agent = trainer.agent
    tensors: dict[str, torch.Tensor] = {}
    for k, v in agent.online_net.state_dict().items():
        tensors[f"online.{k}"] = v
    for k, v in agent.target_net.state_dict().items():
        tensors[f"target.{k}"] = v
    opt = agent.optimizer.state_dict()
    opt_scalars: dict[str, dict[str, Any]] = {}
    flips = stored_transposed(agent.online_net)
    for idx, st in opt["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val):
                # Per-parameter state in the parameter's file layout (nn.Linear's).
                flip = flips[idx] and val.dim() == 2
                tensors[f"optim.{idx}.{key}"] = val.t() if flip else val
            else:
                opt_scalars.setdefault(str(idx), {})[key] = val
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.noise"] = agent.noise_generator.get_state()
    tensors.update(trainer.replay.state_tensors())
    tensors.update(trainer.nstep.state_tensors())
    # Restored from a fresh-reset checkpoint and not stepped since: the envs' observations at
    # that checkpoint, so the pending n-step starts are still flushed there by a later resume.
    obs = trainer._obs if trainer._obs is not None else trainer._stale_obs
    if obs is not None:
        tensors["loop.obs"] = torch.from_numpy(obs.copy())
    tensors["loop.ep_return"] = torch.from_numpy(trainer._ep_return.copy())
    tensors["loop.ep_length"] = torch.from_numpy(trainer._ep_length.copy())
    for k, v in (trainer.best_state or {}).items():
        tensors[f"best.{k}"] = v
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    w = trainer._window
    sched = {k: v for k, v in agent.scheduler.state_dict().items() if k != "lr_lambdas"}
    state: dict[str, Any] = {
        "kind": "foxhunt-trainer",
        "hyperparameters": trainer.hp.to_dict(),
        "optimizer": {
            "param_groups": opt["param_groups"],
            "scalars": opt_scalars,
            "n_state": len(opt["state"]),
        },
        "scheduler": sched,
        "scaler": agent.scaler.state_dict() if agent.scaler is not None else None,
        "agent": {
            "optimizer_steps": agent.optimizer_steps,
            "skipped_steps": agent.skipped_steps,
            "consecutive_skips": agent.consecutive_skips,
            "rng": agent.rng.bit_generator.state,
            "learner_path": agent.learner_path,
        },
        "loop": {
            "env_steps": trainer.env_steps,
            "episodes": trainer.episodes,
            "total_env_steps": trainer.total_env_steps,
            "last_eval_return": trainer.last_eval_return,
            "best_eval_return": trainer.best_eval_return,
            "eval_history": trainer.eval_history,
            "pending_eval": trainer._pending_eval,
            "train_rounds": trainer._train_rounds,
            "next_log": trainer._next_log,
            "next_eval": None if math.isinf(trainer._next_eval) else trainer._next_eval,
            "next_ckpt": None if math.isinf(trainer._next_ckpt) else trainer._next_ckpt,
            "has_obs": obs is not None,
            "window": {
                "updates": w.updates,
                "loss": w.loss,
                "pre": w.pre,
                "post": w.post,
                "stepped": w.stepped,
                "clipped": w.clipped,
                "q_mean": w.q_mean,
                "returns": w.returns,
                "lengths": w.lengths,
                "env_steps0": w.env_steps0,
            },
        },
        "replay": trainer.replay.state_json(),
        "nstep": trainer.nstep.state_json(),
        "health": trainer.health.state_json(),
        "envs": get_vector_env_state(trainer.envs),
        "rng": {"python": _jsonable_py_random(random.getstate()), "numpy": _encode_np_global()},
    }
    # Normalise to plain JSON types (tuples become lists) so a saved-then-loaded state compares
    # equal to a freshly captured one.
    return tensors, json.loads(json.dumps(state))


def _jsonable_py_random(s: tuple) -> list:  # type: ignore[type-arg]
    return [s[0], list(s[1]), s[2]]


def restore_state(
    trainer: DQNTrainer, tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> None:
    """Load :func:`capture_state` output into a freshly built trainer of the same spec.

    A checkpoint is untrusted input (its hashes prove integrity, not sense), so loading is all or
    nothing: fields and tensors are first checked against the trainer's own types and shapes; then
    the state is applied and captured again, and anything a component rejected, ignored or coerced
    (an extra tensor, ``"5"`` for ``5``) rolls the trainer back to exactly where it was. Every
    failure is a one-line :class:`~foxhunt.errors.CheckpointError` naming the field or tensor.
    """
    _check_state(trainer, tensors, state)
    live, live_state = capture_state(trainer)
    backup = ({k: v.clone() for k, v in live.items()}, live_state)  # live tensors are views
    stage = ["start"]
    try:
        _apply_state(trainer, tensors, state, stage)
        _check_round_trip(trainer, tensors, state)
    except (CheckpointError, *_LOAD_ERRORS) as err:
        _apply_state(trainer, *backup, ["rollback"])
        if isinstance(err, CheckpointError):
            raise
        detail = " ".join(str(err).split())
        raise CheckpointError(
            f"checkpoint {stage[0]} state is malformed: {type(err).__name__}: {detail}"
        ) from None


# What component loaders raise on malformed input (torch raises RuntimeError for bad RNG states).
_LOAD_ERRORS = (
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
    OverflowError,
    RuntimeError,
)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (_is_count, "a non-negative integer"),
    "count?": (lambda v: v is None or _is_count(v), "a non-negative integer or null"),
    "number": (_is_number, "a number"),
    "number?": (lambda v: v is None or _is_number(v), "a number or null"),
    "finite": (
        lambda v: _is_number(v) and math.isfinite(v) and v >= 0,
        "a finite non-negative number",
    ),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "dict": (lambda v: isinstance(v, dict), "a mapping"),
    "dict?": (lambda v: v is None or isinstance(v, dict), "a mapping or null"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "list?": (lambda v: v is None or isinstance(v, list), "a list or null"),
    "numbers": (lambda v: isinstance(v, list) and all(map(_is_number, v)), "a list of numbers"),
    "counts": (
        lambda v: isinstance(v, list) and all(map(_is_count, v)),
        "a list of non-negative integers",
    ),
}

# Fields the loop reads directly; components (replay, n-step, health, optimizer, RNGs) check
# their own parts when loading, and the round trip catches what they silently accept.
_FIELDS: tuple[tuple[str, str], ...] = (
    ("optimizer", "dict"),
    ("optimizer.param_groups", "list"),
    ("optimizer.scalars", "dict"),
    ("optimizer.n_state", "count"),
    ("scheduler", "dict"),
    ("scaler", "dict?"),
    ("agent.optimizer_steps", "count"),
    ("agent.skipped_steps", "count"),
    ("agent.consecutive_skips", "count"),
    ("agent.rng", "dict"),
    ("loop.env_steps", "count"),
    ("loop.episodes", "count"),
    ("loop.total_env_steps", "count"),
    ("loop.last_eval_return", "number?"),
    ("loop.best_eval_return", "number?"),
    ("loop.eval_history", "list"),
    ("loop.pending_eval", "number?"),
    ("loop.train_rounds", "count"),
    ("loop.next_log", "count"),
    ("loop.next_eval", "count?"),
    ("loop.next_ckpt", "count?"),
    ("loop.has_obs", "bool"),
    ("loop.window.updates", "count"),
    ("loop.window.loss", "number"),
    ("loop.window.pre", "number"),
    ("loop.window.post", "number"),
    ("loop.window.clipped", "count"),
    ("loop.window.q_mean", "number"),
    ("loop.window.returns", "numbers"),
    ("loop.window.lengths", "counts"),
    ("loop.window.env_steps0", "count"),
    ("replay", "dict"),
    ("replay.size", "count"),
    ("replay.pos", "count"),
    ("nstep", "dict"),
    ("health", "dict"),
    ("envs", "list?"),
    ("rng", "dict"),
    ("rng.python", "list"),
    ("rng.numpy", "dict"),
)


def _field(state: dict[str, Any], path: str, kind: str) -> Any:
    value: Any = state
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise CheckpointError(f"checkpoint state field {path} is missing")
        value = value[part]
    ok, desc = _KINDS[kind]
    if not ok(value):
        raise CheckpointError(f"checkpoint state field {path} must be {desc}, got: {value!r:.80}")
    return value


def _check_tensor(
    tensors: dict[str, torch.Tensor], key: str, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    if key not in tensors:
        raise CheckpointError(f"checkpoint is missing tensor {key!r}")
    t = tensors[key]
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise CheckpointError(
            f"checkpoint tensor {key!r} is {t.dtype} {tuple(t.shape)}, expected {dtype} {shape}"
        )


def _check_state(
    trainer: DQNTrainer, tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> None:
    """Everything that can be checked before changing the trainer; errors name field and value."""
    if not isinstance(state, dict) or state.get("kind") != "foxhunt-trainer":
        kind = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint state is not a foxhunt trainer state (kind={kind!r})")
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in tensors.items()
    ):
        raise CheckpointError("checkpoint tensors must map names to tensors")
    _check_hyperparameters(trainer, state)
    values = {path: _field(state, path, kind) for path, kind in _FIELDS}
    path_taken = state["agent"].get("learner_path")  # absent from older checkpoints
    if path_taken is not None and path_taken not in LEARNER_PATHS:
        raise CheckpointError(
            f"checkpoint state field agent.learner_path must be null or one of "
            f"{', '.join(LEARNER_PATHS)}, got: {path_taken!r:.60}"
        )
    _check_replay_and_loop(trainer, state, values)
    _check_actions_nstep_and_health(trainer, tensors, state)
    _check_optimizer_settings(trainer, values)
    _check_fixed_tensors(trainer, tensors, values)
    _check_optimizer_tensors(trainer, tensors, values)


def _check_hyperparameters(trainer: DQNTrainer, state: dict[str, Any]) -> None:
    """The checkpoint's hyperparameters are the run's (fields newer than it at their defaults)."""
    hp, saved = trainer.hp.to_dict(), dict(_field(state, "hyperparameters", "dict"))
    for key in set(hp) - set(saved):  # added after the checkpoint was written: at its default
        default = DQNHyperparameters.model_fields[key].default
        if json.loads(json.dumps(default)) == hp[key]:
            saved[key] = hp[key]
    if saved != hp:
        diff = sorted(set(saved) ^ set(hp) | {k for k in set(saved) & set(hp) if saved[k] != hp[k]})
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        raise CheckpointError(
            f"checkpoint hyperparameters differ from the run's: {diff[0]}="
            f"{saved.get(diff[0])!r} in the checkpoint, {hp.get(diff[0])!r} in the run{more}"
        )


def _check_replay_and_loop(
    trainer: DQNTrainer, state: dict[str, Any], values: dict[str, Any]
) -> None:
    """Replay position and size, and the loop's counters and boundaries, against the run."""
    hp_ = trainer.hp
    capacity = trainer.replay.capacity
    size, pos = values["replay.size"], values["replay.pos"]
    if size > capacity:
        raise CheckpointError(
            f"checkpoint state field replay.size must be at most buffer_capacity "
            f"{capacity}, got: {size}"
        )
    if pos >= capacity or (size < capacity and pos != size):
        raise CheckpointError(
            f"checkpoint state field replay.pos must be the next free slot "
            f"(size {size}, capacity {capacity}), got: {pos}"
        )
    if isinstance(trainer.replay, PrioritizedReplayBuffer):
        mp = _field(state, "replay.max_priority", "finite")
        if mp <= 0:
            raise CheckpointError(
                f"checkpoint state field replay.max_priority must be greater than 0, got: {mp}"
            )
    env_steps = values["loop.env_steps"]
    stepped = state["loop"]["window"].get("stepped", values["loop.window.updates"])
    if (
        isinstance(stepped, bool)
        or not isinstance(stepped, int)
        or not 0 <= stepped <= values["loop.window.updates"]
    ):
        raise CheckpointError(
            "checkpoint state field loop.window.stepped must be an integer in "
            f"0..{values['loop.window.updates']}, got: {stepped!r}"
        )
    # The loop's next boundaries: a boundary set while its interval is 0 (disabled) hung the
    # loop (eval: `while next <= steps: next += 0`) or saved every step (checkpoints); one left
    # unset while the interval is on silently stopped the evaluations or checkpoints. A
    # boundary is a multiple of its interval; the next evaluation's lies ahead (it is moved on
    # as soon as it is reached), the next checkpoint's may lag when n_envs exceeds the interval.
    for name, interval in (
        ("next_eval", hp_.eval_interval),
        ("next_ckpt", hp_.checkpoint_interval),
    ):
        nxt = values[f"loop.{name}"]
        if interval == 0:
            ok, want = nxt is None, "null (its interval is 0)"
        else:
            ahead = name == "next_ckpt" or (nxt is not None and nxt > env_steps)
            ok = nxt is not None and nxt > 0 and nxt % interval == 0 and ahead
            want = f"a multiple of {interval}" + (
                "" if name == "next_ckpt" else f" after {env_steps}"
            )
        if not ok:
            raise CheckpointError(
                f"checkpoint state field loop.{name} must be {want}, got: {nxt!r}"
            )
    if values["loop.train_rounds"] > env_steps // hp_.train_freq:
        raise CheckpointError(
            f"checkpoint state field loop.train_rounds must be at most env_steps "
            f"// train_freq = {env_steps // hp_.train_freq}, got: "
            f"{values['loop.train_rounds']}"
        )
    for i, item in enumerate(values["loop.eval_history"]):
        if not (
            isinstance(item, list) and len(item) == 2 and _is_count(item[0]) and _is_number(item[1])
        ):
            raise CheckpointError(
                f"checkpoint state field loop.eval_history[{i}] must be "
                f"[env_steps, return], got: {item!r:.80}"
            )


def _check_actions_nstep_and_health(
    trainer: DQNTrainer, tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> None:
    """Stored actions within the env's, pending n-step lengths, the health monitor's fields."""
    n_actions = trainer.agent.n_actions
    for key, acts in tensors.items():  # an action index past the head: a crash later
        stored = key == "replay.actions" or (
            key.startswith("nstep.") and key.endswith((".actions", ".cf_actions"))
        )
        if stored and acts.numel() and not acts.is_floating_point():
            bad = (acts < 0) | (acts >= n_actions)
            if bool(bad.any()):
                raise CheckpointError(
                    f"checkpoint tensor {key} holds action {int(acts[bad][0])}, outside the "
                    f"env's 0..{n_actions - 1}"
                )
    lengths = state["nstep"].get("lengths")
    n_step = trainer.hp.n_step
    if isinstance(lengths, list) and not all(_is_count(n) and n < n_step for n in lengths):
        raise CheckpointError(
            f"checkpoint state field nstep.lengths must hold counts below "
            f"n_step={n_step}, got: {lengths!r:.80}"
        )
    _field(state, "health.max_abs_reward", "finite")  # in every checkpoint: no default
    if state["health"].get("initial_q_abs_max") is not None:
        _field(state, "health.initial_q_abs_max", "finite")
    if "divergent_run" in state["health"]:
        _field(state, "health.divergent_run", "count")


def _check_optimizer_settings(trainer: DQNTrainer, values: dict[str, Any]) -> None:
    """Optimizer groups, scheduler and grad scaler: the fresh trainer's structure and rates."""
    agent = trainer.agent
    # Optimizer and scheduler states are applied with ``__dict__.update``-like loaders: hold them
    # to the fresh trainer's structure, and the optimizer settings to the hyperparameters.
    fresh_groups = json.loads(json.dumps(agent.optimizer.state_dict()["param_groups"]))
    _check_like(values["optimizer.param_groups"], fresh_groups, "optimizer.param_groups")
    for i, (saved_g, fresh_g) in enumerate(
        zip(values["optimizer.param_groups"], fresh_groups, strict=True)
    ):
        for k, v in fresh_g.items():
            if k != "lr" and saved_g[k] != v:
                raise CheckpointError(
                    f"checkpoint state field optimizer.param_groups[{i}].{k} "
                    f"must be {v!r} (from the hyperparameters), got: "
                    f"{saved_g[k]!r:.60}"
                )
    sched = {k: v for k, v in agent.scheduler.state_dict().items() if k != "lr_lambdas"}
    _check_like(values["scheduler"], json.loads(json.dumps(sched)), "scheduler")
    # The schedule's base rate is the hyperparameter's (LambdaLR's initial_lr), and the rate in
    # force is the scheduler's last one: neither may be set apart from the hyperparameters.
    saved_sched, group0 = values["scheduler"], values["optimizer.param_groups"][0]
    learning_rate = trainer.hp.learning_rate
    if saved_sched["base_lrs"] != [group0.get("initial_lr", learning_rate)]:
        raise CheckpointError(
            f"checkpoint state field scheduler.base_lrs must be [{learning_rate!r}] "
            f"(learning_rate), got: {saved_sched['base_lrs']!r:.60}"
        )
    if saved_sched["_last_lr"] != [group0["lr"]]:
        raise CheckpointError(
            f"checkpoint state field optimizer.param_groups[0].lr must be the scheduler's last "
            f"rate {saved_sched['_last_lr']!r:.60}, got: {group0['lr']!r:.60}"
        )
    scaler = agent.scaler.state_dict() if agent.scaler is not None else None
    _check_like(values["scaler"], json.loads(json.dumps(scaler)), "scaler")


def _check_fixed_tensors(
    trainer: DQNTrainer, tensors: dict[str, torch.Tensor], values: dict[str, Any]
) -> None:
    """Tensors whose dtype and shape the trainer alone determines."""
    agent, hp_ = trainer.agent, trainer.hp
    online = agent.online_net.state_dict()
    fixed: dict[str, torch.Tensor] = {f"online.{k}": v for k, v in online.items()}
    fixed.update({f"target.{k}": v for k, v in agent.target_net.state_dict().items()})
    fixed["rng.torch"] = torch.get_rng_state()
    fixed["rng.noise"] = agent.noise_generator.get_state()
    fixed["loop.ep_return"] = torch.from_numpy(trainer._ep_return)
    fixed["loop.ep_length"] = torch.from_numpy(trainer._ep_length)
    if any(k.startswith("best.") for k in tensors):
        fixed.update({f"best.{k}": v for k, v in online.items()})
    if values["loop.has_obs"]:
        shape = (hp_.n_envs, *trainer.envs.single_observation_space.shape)
        fixed["loop.obs"] = torch.zeros(shape, dtype=torch.float32)
    for key, ref in fixed.items():
        _check_tensor(tensors, key, ref.dtype, tuple(ref.shape))


def _check_optimizer_tensors(
    trainer: DQNTrainer, tensors: dict[str, torch.Tensor], values: dict[str, Any]
) -> None:
    """Per-parameter optimizer state: complete, alike across parameters, the parameters' shapes."""
    agent = trainer.agent
    params = list(agent.online_net.parameters())
    shapes = [
        tuple(reversed(p.shape)) if flip else tuple(p.shape)
        for p, flip in zip(params, stored_transposed(agent.online_net), strict=True)
    ]
    if values["optimizer.n_state"] > len(params):
        raise CheckpointError(
            f"checkpoint state field optimizer.n_state must be at most the "
            f"{len(params)} parameters, got: {values['optimizer.n_state']}"
        )
    for idx, scalars in values["optimizer.scalars"].items():
        if not (
            idx.isdigit()
            and int(idx) < len(params)
            and isinstance(scalars, dict)
            and all(v is None or isinstance(v, bool | int | float) for v in scalars.values())
        ):
            raise CheckpointError(
                f"checkpoint state field optimizer.scalars.{idx} must map names "
                f"to numbers for one of {len(params)} parameters, got: "
                f"{scalars!r:.60}"
            )
    # Every parameter the optimizer holds state for holds all of it, alike: a partial one passed
    # the round trip and failed at the first optimizer step with a KeyError.
    held: dict[str, set[str]] = {}
    for key in tensors:
        parts = key.split(".", 2)
        if parts[0] == "optim" and len(parts) == 3:
            held.setdefault(parts[1], set()).add(parts[2])
    for idx, scalars in values["optimizer.scalars"].items():
        if isinstance(scalars, dict):
            held.setdefault(str(idx), set()).update(scalars)
    if len(held) != values["optimizer.n_state"]:
        raise CheckpointError(
            f"checkpoint state field optimizer.n_state must count the {len(held)} parameters "
            f"the checkpoint holds optimizer state for, got: {values['optimizer.n_state']}"
        )
    needed = _optimizer_state_needs(agent.optimizer)
    for idx, scalars in values["optimizer.scalars"].items():
        # The step reads these as tensors: a JSON number passed and failed at the first update.
        for name in sorted(needed & set(scalars)):
            raise CheckpointError(
                f"checkpoint optimizer state optim.{idx}.{name} must be a tensor, got the "
                f"number {scalars[name]!r:.40}"
            )
    first = next(iter(held.values()), set())
    for idx, keys in sorted(held.items()):
        if not needed <= keys or keys != first:
            raise CheckpointError(
                f"checkpoint optimizer state of parameter {idx} holds {sorted(keys)}, expected "
                f"{sorted(needed | first)} (tensors optim.{idx}.*)"
            )
    for key, t in tensors.items():
        if not key.startswith("optim."):
            continue
        idx = key.split(".")[1]
        if not idx.isdigit() or int(idx) >= len(params) or len(key.split(".")) != 3:
            raise CheckpointError(f"checkpoint holds unexpected tensor {key!r}")
        shape = shapes[int(idx)]
        if not t.is_floating_point() or tuple(t.shape) not in ((), shape):
            raise CheckpointError(
                f"checkpoint tensor {key!r} is {t.dtype} {tuple(t.shape)}, "
                f"expected a float scalar or {shape}"
            )


def _optimizer_state_needs(optimizer: torch.optim.Optimizer) -> set[str]:
    """The per-parameter state keys ``optimizer``'s step reads (a newer PyTorch may keep more;
    an optimizer not known here: none are required)."""
    group = optimizer.param_groups[0]
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return {"step", "exp_avg", "exp_avg_sq"} | (
            {"max_exp_avg_sq"} if group["amsgrad"] else set()
        )
    if isinstance(optimizer, torch.optim.RMSprop):
        return (
            {"step", "square_avg"}
            | ({"momentum_buffer"} if group["momentum"] > 0 else set())
            | ({"grad_avg"} if group["centered"] else set())
        )
    if isinstance(optimizer, torch.optim.SGD) and group["momentum"] > 0:
        return {"momentum_buffer"}
    return set()


def _check_like(saved: Any, fresh: Any, path: str) -> None:
    """``saved`` must have the structure and value kinds of a fresh trainer's ``fresh``."""
    if isinstance(fresh, dict):
        ok = isinstance(saved, dict) and set(saved) == set(fresh)
        kind = f"a mapping with keys {sorted(fresh)}"
    elif isinstance(fresh, list):
        ok = isinstance(saved, list) and len(saved) == len(fresh)
        kind = f"a list of {len(fresh)} items"
    elif isinstance(fresh, bool) or fresh is None or isinstance(fresh, str):
        ok, kind = type(saved) is type(fresh), f"a {type(fresh).__name__}"
    elif isinstance(fresh, int):
        ok, kind = _is_count(saved), "a non-negative integer"
    else:
        ok, kind = _is_number(saved) and math.isfinite(saved), "a finite number"
    if not ok:
        raise CheckpointError(f"checkpoint state field {path} must be {kind}, got: {saved!r:.80}")
    if isinstance(fresh, dict):
        for k in fresh:
            _check_like(saved[k], fresh[k], f"{path}.{k}")
    elif isinstance(fresh, list):
        for i, (s, f) in enumerate(zip(saved, fresh, strict=True)):
            _check_like(s, f, f"{path}[{i}]")


def _apply_state(
    trainer: DQNTrainer, tensors: dict[str, torch.Tensor], state: dict[str, Any], stage: list[str]
) -> None:
    """Write a checked state into the trainer; ``stage[0]`` names the part being loaded."""
    import random

    from foxhunt.envstate import set_vector_env_state

    agent = trainer.agent
    stage[0] = "network"
    agent.online_net.load_state_dict(
        {k[7:]: v for k, v in tensors.items() if k.startswith("online.")}
    )
    agent.target_net.load_state_dict(
        {k[7:]: v for k, v in tensors.items() if k.startswith("target.")}
    )
    stage[0] = "optimizer"
    opt_state: dict[int, dict[str, Any]] = {}
    flips = stored_transposed(agent.online_net)
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, idx, key = k.split(".", 2)
            if flips[int(idx)] and v.dim() == 2:  # file layout -> the parameter's storage
                v = v.t().contiguous()
            opt_state.setdefault(int(idx), {})[key] = v
    for idx, scalars in state["optimizer"]["scalars"].items():
        opt_state.setdefault(int(idx), {}).update(scalars)
    agent.optimizer.load_state_dict(
        {"state": opt_state, "param_groups": state["optimizer"]["param_groups"]}
    )
    stage[0] = "scheduler"
    agent.scheduler.load_state_dict({**state["scheduler"], "lr_lambdas": [None]})
    if agent.scaler is not None and state["scaler"]:
        agent.scaler.load_state_dict(state["scaler"])
    stage[0] = "agent"
    a = state["agent"]
    agent.optimizer_steps = int(a["optimizer_steps"])
    agent.skipped_steps = int(a["skipped_steps"])
    agent.consecutive_skips = int(a["consecutive_skips"])
    # How the checkpoint's last update ran: a resume that takes no step before the end still
    # reports it in summary.json (checkpoints from before it was recorded: None, as before).
    agent.learner_path = a.get("learner_path")
    agent.rng.bit_generator.state = a["rng"]
    stage[0] = "rng"
    torch.set_rng_state(tensors["rng.torch"])
    agent.noise_generator.set_state(tensors["rng.noise"])
    stage[0] = "replay"
    trainer.replay.load_state(tensors, state["replay"])
    stage[0] = "nstep"
    trainer.nstep.load_state(tensors, state["nstep"])
    stage[0] = "health"
    trainer.health.load_state(state["health"])
    stage[0] = "loop"
    lp = state["loop"]
    trainer.env_steps = int(lp["env_steps"])
    trainer.episodes = int(lp["episodes"])
    trainer.total_env_steps = int(lp["total_env_steps"])
    trainer.last_eval_return = lp["last_eval_return"]
    trainer.best_eval_return = lp["best_eval_return"]
    trainer.eval_history = [tuple(x) for x in lp["eval_history"]]  # type: ignore[misc]
    trainer._pending_eval = lp["pending_eval"]
    trainer._train_rounds = int(lp["train_rounds"])
    trainer._next_log = int(lp["next_log"])
    trainer._next_eval = math.inf if lp["next_eval"] is None else int(lp["next_eval"])
    trainer._next_ckpt = math.inf if lp["next_ckpt"] is None else int(lp["next_ckpt"])
    w = lp["window"]
    trainer._window = MetricsWindow(
        updates=w["updates"],
        loss=w["loss"],
        pre=w["pre"],
        post=w["post"],
        stepped=w.get("stepped", w["updates"]),  # checkpoints from before it counted every update
        clipped=w["clipped"],
        q_mean=w["q_mean"],
        returns=list(w["returns"]),
        lengths=list(w["lengths"]),
        env_steps0=w["env_steps0"],
    )
    trainer._ep_return = tensors["loop.ep_return"].numpy().copy()
    trainer._ep_length = tensors["loop.ep_length"].numpy().copy()
    best = {k[5:]: v.clone() for k, v in tensors.items() if k.startswith("best.")}
    trainer.best_state = best or None
    stage[0] = "envs"
    trainer._stale_obs = None
    if not lp["has_obs"]:
        trainer._obs = None
    elif state["envs"] is not None:
        trainer._obs = tensors["loop.obs"].numpy().copy()
        trainer.envs.reset(seed=trainer.hp.seed)  # builds internal buffers; state overwritten
        set_vector_env_state(trainer.envs, state["envs"])
    else:
        log.warning(
            "this environment's state cannot be captured: resuming from a fresh "
            "reset (episodes in progress at the checkpoint are restarted)"
        )
        trainer._obs = None
        # The n-step starts pending at the checkpoint end where their env stood then: flushed
        # as truncated (bootstrapping from it) at the fresh reset, not spliced onto new episodes.
        trainer._stale_obs = tensors["loop.obs"].numpy().copy()
        trainer._ep_return[:] = 0.0
        trainer._ep_length[:] = 0
    stage[0] = "rng"
    py = state["rng"]["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    _decode_np_global(state["rng"]["numpy"])


def _check_round_trip(
    trainer: DQNTrainer, tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> None:
    """Capture the restored trainer again: it must reproduce the checkpoint bit for bit."""
    again, state_again = capture_state(trainer)
    # Hyperparameters were matched (fields newer than the checkpoint at their defaults). "run"
    # is the session's record of the environment config (foxhunt.session checks it), not the
    # trainer's.
    expected = {k: v for k, v in state.items() if k != "run"}
    expected["hyperparameters"] = trainer.hp.to_dict()
    # Health counters newer than the checkpoint start where a fresh run does.
    expected["health"] = {**NEWER_HEALTH_FIELDS, **state["health"]}
    expected["agent"] = {"learner_path": None, **state["agent"]}
    window = state["loop"]["window"]  # "stepped": before it was counted, every update stepped
    expected["loop"] = {**state["loop"], "window": {"stepped": window["updates"], **window}}
    skip: set[str] = set()
    if state["loop"]["has_obs"] and state["envs"] is None:  # restarted from a fresh reset
        skip = {"loop.ep_return", "loop.ep_length"}  # zeroed: the episodes restart
    # Replay holding pixels as levels compares a float32-era checkpoint's values decoded.
    pixels = ("replay.obs", "replay.next_obs") if trainer.replay.obs_scale is not None else ()
    for key in sorted((set(tensors) | set(again)) - skip):
        if key not in again:
            t = tensors[key]
            raise CheckpointError(
                f"checkpoint holds unexpected tensor {key!r} ({t.dtype} {tuple(t.shape)})"
            )
        if key not in tensors:
            raise CheckpointError(f"checkpoint is missing tensor {key!r}")
        a, b = tensors[key], again[key]
        if key in pixels and a.is_floating_point():
            b = trainer.replay.decode_obs(b)  # saved when replay kept pixels as float32
        if a.dtype != b.dtype or a.shape != b.shape:
            raise CheckpointError(
                f"checkpoint tensor {key!r} is {a.dtype} {tuple(a.shape)}, "
                f"loads as {b.dtype} {tuple(b.shape)}"
            )
        if not torch.equal(_bits(a), _bits(b)):
            raise CheckpointError(f"checkpoint tensor {key!r} changes when loaded")
    diff = _first_difference(expected, state_again, "")
    if diff is not None:
        raise CheckpointError(f"checkpoint state field {diff}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (so NaN payloads and -0.0 compare exactly)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _first_difference(saved: Any, loaded: Any, path: str) -> str | None:
    """Where a loaded-then-captured state differs from the saved one, for the error message."""
    if isinstance(saved, dict) and isinstance(loaded, dict):
        for key in sorted(set(saved) | set(loaded)):
            where = f"{path}.{key}" if path else key
            if key not in loaded:
                return f"{where} is not used by this trainer (value {saved[key]!r:.60})"
            if key not in saved:
                return f"{where} is missing"
            found = _first_difference(saved[key], loaded[key], where)
            if found is not None:
                return found
        return None
    if isinstance(saved, list) and isinstance(loaded, list) and len(saved) == len(loaded):
        for i, (s, x) in enumerate(zip(saved, loaded, strict=True)):
            found = _first_difference(s, x, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if json.dumps(saved) != json.dumps(loaded):  # exact: 5 != 5.0, NaN == NaN
        return f"{path or 'state'} is {saved!r:.60} in the checkpoint but loads as {loaded!r:.60}"
    return None
