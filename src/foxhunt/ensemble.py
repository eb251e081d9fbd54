"""Ensembles of Q-networks: mean and spread of member Q-values, and policies that use the spread.

Independently seeded DQN members trained on the same task disagree where their data says little;
the spread of their Q-values is a cheap epistemic-uncertainty signal (Osband et al. 2016, "Deep
Exploration via Bootstrapped DQN"; Lakshminarayanan et al. 2017, "Deep Ensembles").
Acting on ``mean - risk_aversion * std`` is a lower-confidence-bound policy: it prefers actions the
members agree are good over actions only some of them like. In trading, standing aside (the flat
position) when the chosen action's std is too high skips bets the members cannot agree on.

Conventions: Q-values are returned as NumPy ``float64`` arrays of shape ``[B, A]`` (host values a
policy, a backtest or a report consumes directly). ``std`` is the population standard deviation
over members (``ddof=0``): the members *are* the ensemble, not a sample of it, and a one-member
ensemble then has std 0 rather than NaN. Every member is evaluated with its online net in eval
mode (noisy layers use their mean weights), and its train/eval mode is restored afterwards.

An ensemble run directory holds ``config.yaml`` (the base spec), ``ensemble.json`` (the member list)
and one full run directory per member, ``member-{i}``, trained with :func:`member_seed`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from foxhunt._io import atomic_write_text, read_json_object
from foxhunt.errors import ConfigError, DataError, FoxhuntError
from foxhunt.learner import DQNAgent
from foxhunt.runs import DATA_FILE, RunSpec, data_path, load_model, load_spec, require_spec

log = logging.getLogger("foxhunt.ensemble")

ENSEMBLE_FILE = "ensemble.json"
ENSEMBLE_FORMAT = "foxhunt-ensemble"
ENSEMBLE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class EnsembleDecision:
    """What the ensemble chose for a batch of observations, and how sure it was."""

    actions: np.ndarray
    """``[B]`` int64 actions taken (after any fallback)."""
    chosen: np.ndarray
    """``[B]`` int64 argmax of ``mean - risk_aversion * std`` (before any fallback)."""
    chosen_std: np.ndarray
    """``[B]`` std over members of the Q-value of ``chosen``."""
    disagreement: np.ndarray
    """``[B]`` share of members whose own greedy action differs from ``chosen``."""
    fell_back: np.ndarray
    """``[B]`` bool: ``chosen_std > max_std`` so the fallback action was taken."""
    mean: np.ndarray
    """``[B, A]`` mean Q over members."""
    std: np.ndarray
    """``[B, A]`` std of Q over members."""


def _check_finite(name: str, value: float) -> float:
    # numbers.Real takes NumPy's scalars (np.float32 from an array) as well as Python's.
    real = isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
    if not real or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got: {value!r}")
    return float(value)


def _lcb_argmax(mean: np.ndarray, std: np.ndarray, risk_aversion: float) -> np.ndarray:
    """argmax of the lower confidence bound ``mean - risk_aversion * std`` (ties: lowest index)."""
    return np.argmax(mean - risk_aversion * std, axis=1)


class QEnsemble:
    """Several trained :class:`~foxhunt.learner.DQNAgent` members acting as one policy.

    Members must share the observation size, the number of actions and (when regime-conditional)
    the number of regimes; anything else (network width, dueling, C51/QR heads, noisy nets) may
    differ, since every head is reduced to expected Q-values first. ``names`` label the members in
    error messages and reports (default ``member-{i}``).
    """

    def __init__(self, agents: Sequence[DQNAgent], *, names: Sequence[str] | None = None) -> None:
        agents = list(agents)
        if not agents:
            raise ConfigError("agents must hold at least one DQNAgent, got: 0")
        labels = [str(n) for n in names] if names is not None else None
        if labels is None:
            labels = [f"member-{i}" for i in range(len(agents))]
        if len(labels) != len(agents):
            raise ConfigError(f"names must give one name per agent ({len(agents)}), got: {labels}")
        for label, agent in zip(labels, agents, strict=True):
            if not isinstance(agent, DQNAgent):
                raise ConfigError(
                    f"ensemble member {label} must be a DQNAgent, got: {type(agent).__name__}"
                )
        ref, ref_label = agents[0], labels[0]
        regime_ref: tuple[str, int] | None = None
        for label, agent in zip(labels, agents, strict=True):
            if agent.obs_dim != ref.obs_dim:
                raise ConfigError(
                    f"ensemble member {label}: obs_dim must equal {ref_label}'s {ref.obs_dim}, "
                    f"got: {agent.obs_dim}"
                )
            if agent.n_actions != ref.n_actions:
                raise ConfigError(
                    f"ensemble member {label}: n_actions must equal {ref_label}'s "
                    f"{ref.n_actions}, got: {agent.n_actions}"
                )
            k = agent.online_net.n_regimes
            if k:
                # Same obs size but a different regime count means a different observation layout.
                if regime_ref is not None and k != regime_ref[1]:
                    raise ConfigError(
                        f"ensemble member {label}: n_regimes must equal {regime_ref[0]}'s "
                        f"{regime_ref[1]}, got: {k}"
                    )
                regime_ref = regime_ref or (label, k)
        _warn_identical(agents, labels)
        # The env's terms (predict): every member that recorded them must agree; models saved
        # before they were recorded take the others'.
        recorded = [(n, a.env_interface) for n, a in zip(labels, agents, strict=True)]
        recorded = [(n, i) for n, i in recorded if i.known]
        for label, interface in recorded[1:]:
            if interface != recorded[0][1]:
                raise ConfigError(
                    f"ensemble member {label}: its env's observations and actions map to the "
                    f"network as {interface}, {recorded[0][0]}'s as {recorded[0][1]}"
                )
        self.agents: list[DQNAgent] = agents
        self.names: list[str] = labels
        self.env_interface = recorded[0][1] if recorded else ref.env_interface
        self.obs_dim: int = ref.obs_dim
        self.n_actions: int = ref.n_actions

    def __len__(self) -> int:
        return len(self.agents)

    # --- construction from disk
    @classmethod
    def from_run_dirs(cls, paths: Sequence[str | Path]) -> QEnsemble:
        """Load each run directory's final model (``model.safetensors`` + ``model.json``)."""
        dirs = [Path(p) for p in paths]
        if not dirs:
            raise ConfigError("paths must name at least one run directory, got: 0")
        _refuse_repeats([(str(p), d) for p, d in zip(paths, dirs, strict=True)], "paths")
        return cls([load_model(d) for d in dirs], names=[str(d) for d in dirs])

    @classmethod
    def load(cls, run_dir: str | Path) -> QEnsemble:
        """Load the members an ensemble run directory's ``ensemble.json`` lists."""
        run_dir = Path(run_dir)
        members = read_manifest(run_dir)
        agents = [load_model(run_dir / m["path"]) for m in members]
        return cls(agents, names=[m["path"] for m in members])

    # --- values
    def _batch(self, obs: Any) -> np.ndarray:
        """Observations as ``[B, obs_dim]`` float32; one observation becomes a batch of one."""
        try:
            x = np.asarray(obs, dtype=np.float32)
        except (TypeError, ValueError):
            raise ConfigError(
                f"obs must be an array of numbers, {self.obs_dim} per observation, got: "
                f"{type(obs).__name__}"
            ) from None
        if x.ndim >= 2 and math.prod(x.shape[1:]) == self.obs_dim:
            return x.reshape(x.shape[0], self.obs_dim)
        if x.size == self.obs_dim:
            return x.reshape(1, self.obs_dim)
        raise ConfigError(
            f"obs must hold {self.obs_dim} values per observation, got shape: {tuple(x.shape)}"
        )

    def member_q_values(self, obs: Any) -> np.ndarray:
        """``[M, B, A]`` float64 expected Q-values of every member (eval mode, noise off)."""
        x = self._batch(obs)
        out = np.empty((len(self.agents), x.shape[0], self.n_actions), dtype=np.float64)
        for i, agent in enumerate(self.agents):
            net = agent.online_net
            was_training = net.training
            net.eval()
            try:
                with torch.inference_mode():
                    xt = torch.as_tensor(x, device=agent.device)
                    out[i] = net.q_values(net(xt)).double().cpu().numpy()
            finally:
                net.train(was_training)
        return out

    def q_values(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std)`` over members, each ``[B, A]`` float64 (std with ``ddof=0``). Like
        ``greedy_actions`` and ``decide``, it takes the network's view of an observation (pixels
        scaled to [0, 1], Discrete states one-hot); ``predict`` takes the env's own."""
        q = self.member_q_values(obs)
        return q.mean(axis=0), q.std(axis=0)

    def greedy_actions(self, obs: Any, *, risk_aversion: float = 0.0) -> np.ndarray:
        """``[B]`` argmax of ``mean - risk_aversion * std``: 0 is the mean-greedy policy, larger
        values prefer actions the members agree on; a negative value is optimistic (UCB)."""
        k = _check_finite("risk_aversion", risk_aversion)
        return _lcb_argmax(*self.q_values(obs), k)

    def predict(self, obs: Any, *, risk_aversion: float = 0.0) -> np.ndarray | int:
        """:meth:`greedy_actions` in the env's own terms, like ``DQNAgent.predict``: a Discrete
        observation is the env's state index, the action is the env's (``Discrete(n, start)``
        counts from ``start``); one observation gives an int, a batch an array."""
        x = self.env_interface.observations(obs)
        try:
            single = np.shape(x) == self.agents[0].obs_shape
        except ValueError:  # ragged, e.g. env.reset()'s (obs, info): _batch names it
            single = False
        actions = self.env_interface.actions(self.greedy_actions(x, risk_aversion=risk_aversion))
        return int(actions[0]) if single else actions

    def disagreement(self, obs: Any, *, risk_aversion: float = 0.0) -> np.ndarray:
        """``[B]`` share of members whose own greedy action differs from the ensemble's choice."""
        return self.decide(obs, risk_aversion=risk_aversion).disagreement

    def decide(
        self,
        obs: Any,
        *,
        risk_aversion: float = 0.0,
        fallback_action: int | None = None,
        max_std: float | None = None,
    ) -> EnsembleDecision:
        """The full decision for a batch: one forward pass per member gives every statistic."""
        k = _check_finite("risk_aversion", risk_aversion)
        fallback, limit = self._check_fallback(fallback_action, max_std)
        q = self.member_q_values(obs)
        mean, std = q.mean(axis=0), q.std(axis=0)
        chosen = _lcb_argmax(mean, std, k)
        rows = np.arange(chosen.shape[0])
        chosen_std = std[rows, chosen]
        own = q.argmax(axis=2)  # [M, B] each member's greedy action
        disagreement = (own != chosen[None, :]).mean(axis=0)
        # Not "std > limit": an undefined spread (a NaN in the observation) falls back too.
        fell_back = (
            ~(chosen_std <= limit) if limit is not None else np.zeros(chosen.shape[0], dtype=bool)
        )
        actions = np.where(fell_back, fallback if fallback is not None else 0, chosen)
        return EnsembleDecision(
            actions=actions.astype(np.int64),
            chosen=chosen.astype(np.int64),
            chosen_std=chosen_std,
            disagreement=disagreement,
            fell_back=fell_back,
            mean=mean,
            std=std,
        )

    def _check_fallback(
        self, fallback_action: int | None, max_std: float | None
    ) -> tuple[int | None, float | None]:
        if fallback_action is not None and (
            isinstance(fallback_action, bool)
            or not isinstance(fallback_action, int | np.integer)
            or not 0 <= int(fallback_action) < self.n_actions
        ):
            raise ConfigError(
                f"fallback_action must be an action index in 0..{self.n_actions - 1}, "
                f"got: {fallback_action!r}"
            )
        if max_std is None:
            return (None if fallback_action is None else int(fallback_action)), None
        limit = _check_finite("max_std", max_std)
        if limit < 0:
            raise ConfigError(f"max_std must be at least 0, got: {max_std!r}")
        if fallback_action is None:
            raise ConfigError("max_std needs a fallback_action to take when exceeded, got: None")
        return int(fallback_action), limit

    def policy(
        self,
        risk_aversion: float = 0.0,
        fallback_action: int | None = None,
        max_std: float | None = None,
    ) -> Callable[[Any], int]:
        """An ``obs -> action`` function for one observation (e.g. a backtest's ``act``).

        It takes the lower-confidence-bound action, unless that action's std over members exceeds
        ``max_std``, in which case it takes ``fallback_action`` (in trading: the flat position).
        Arguments are validated now, not at the first call.
        """
        _check_finite("risk_aversion", risk_aversion)
        self._check_fallback(fallback_action, max_std)

        def act(obs: Any) -> int:
            d = self.decide(
                obs,
                risk_aversion=risk_aversion,
                fallback_action=fallback_action,
                max_std=max_std,
            )
            return int(d.actions[0])

        return act


# --- ensemble run directories
def read_manifest(run_dir: Path) -> list[dict[str, Any]]:
    """The member entries (``path`` relative to ``run_dir``, ``seed``) of ``ensemble.json``."""
    path = run_dir / ENSEMBLE_FILE
    if not path.is_file():
        raise FoxhuntError(f"not a foxhunt ensemble directory (no {ENSEMBLE_FILE}): {run_dir}")
    meta = read_json_object(path, "ensemble manifest")
    if (
        not isinstance(meta, dict)
        or meta.get("format") != ENSEMBLE_FORMAT
        or meta.get("format_version") != ENSEMBLE_FORMAT_VERSION
    ):
        fmt = meta.get("format") if isinstance(meta, dict) else None
        ver = meta.get("format_version") if isinstance(meta, dict) else None
        raise FoxhuntError(f"{path}: unknown ensemble format {fmt!r} version {ver!r}")
    members = meta.get("members")
    if (
        not isinstance(members, list)
        or not members
        or not all(isinstance(m, dict) and isinstance(m.get("path"), str) for m in members)
    ):
        raise FoxhuntError(f"{path}: members must be a non-empty list of {{path, seed}} entries")
    for m in members:
        p = Path(m["path"])
        if p.is_absolute() or ".." in p.parts:
            raise FoxhuntError(f"{path}: member path must lie inside {run_dir}, got: {m['path']!r}")
    _refuse_repeats([(m["path"], run_dir / m["path"]) for m in members], f"{path}: members")
    return members


def _warn_identical(agents: Sequence[DQNAgent], labels: Sequence[str]) -> None:
    """Say when two members hold the same weights (copies of one run, or one seed trained
    twice): they agree with each other by construction, and the spread reads too small."""
    seen: list[tuple[str, list[torch.Tensor]]] = []
    for label, agent in zip(labels, agents, strict=True):
        weights = [t.detach() for t in agent.online_net.state_dict().values()]
        for other, theirs in seen:
            same = len(theirs) == len(weights) and all(
                torch.equal(a, b) for a, b in zip(theirs, weights, strict=True)
            )
            if same:
                log.warning(
                    "ensemble members %s and %s hold identical weights (one seed trained twice, "
                    "or a copied run): their agreement is not independent, so the ensemble's "
                    "spread understates its uncertainty",
                    other,
                    label,
                )
                return
        seen.append((label, weights))


def _refuse_repeats(dirs: Sequence[tuple[str, Path]], what: str) -> None:
    """A member listed twice is one model counted twice: its agreement with itself would shrink
    the ensemble's spread (every std 0 for copies of one run), read as certainty. ``dirs``:
    (as the user wrote it, the directory)."""
    seen: dict[Path, str] = {}
    for written, d in dirs:
        key = d.resolve()
        if key in seen:
            raise FoxhuntError(f"{what} list the same run twice: {seen[key]!r} and {written!r}")
        seen[key] = written


def train_ensemble(
    spec: RunSpec,
    run_dir: str | Path,
    n_members: int,
    *,
    progress: bool = False,
    verbose: bool = True,
    before_write: Callable[[], None] | None = None,
) -> list[Path]:
    """Train ``n_members`` full runs with seeds :func:`member_seed` into ``run_dir/member-{i}``.

    Members differ only in their seed (weights, exploration, replay sampling), which is the
    whole source of their diversity: Osband et al. 2016 found random initialisation alone gives
    useful disagreement, without bootstrap masks. ``config.yaml`` and ``ensemble.json`` are
    written last, so an ensemble directory that lists its members holds every one of them.
    ``verbose=False`` prints nothing to stdout; the caller's torch thread count is kept.
    ``before_write`` runs once member 0's trainer is built (every input validated) and before
    anything is written; given, ``run_dir`` need not be new: ``foxhunt ensemble train --force``
    removes the old run there, so a bad input keeps it.
    """
    from foxhunt.session import caller_state

    require_spec(spec)
    with caller_state(verbose):
        return _train_ensemble(spec, Path(run_dir), n_members, progress, before_write)


def member_spec(spec: RunSpec, seed: int) -> RunSpec:
    """A member's spec: the ensemble's with the member's seed. A trading member's regime
    detector keeps the ensemble's seed (``market.detector_seed``), as hyperopt's trials do: the
    members then read one regime model, the one ``ensemble evaluate`` builds for all of them,
    where each used to fit its own HMM from its own seed and be judged on member 0's."""
    update: dict[str, Any] = {"hyperparameters": spec.hyperparameters.replace(seed=seed)}
    if spec.is_trading and spec.market.detector_seed is None:
        detector_seed = spec.hyperparameters.seed
        update["market"] = spec.market.model_copy(update={"detector_seed": detector_seed})
    return spec.model_copy(update=update)


def member_seed(seed: int, i: int) -> int:
    """Member ``i``'s seed: the ensemble's own for member 0, then independent seeds drawn from
    it (NumPy SeedSequence of (seed, i), as hyperopt's trials). ``seed + i`` gave adjacent members
    the same environment streams: a vector env seeds its sub-env j with ``seed + j``."""
    if i == 0:
        return seed
    return int(np.random.SeedSequence([seed, i]).generate_state(1)[0]) & 0x7FFF_FFFF


def _train_ensemble(
    spec: RunSpec,
    run_dir: Path,
    n_members: int,
    progress: bool,
    before_write: Callable[[], None] | None = None,
) -> list[Path]:
    from foxhunt.session import require_new_dir, run_training

    if isinstance(n_members, bool) or not isinstance(n_members, int) or n_members < 2:
        raise ConfigError(f"n_members must be an integer of at least 2, got: {n_members!r}")
    if before_write is None:
        require_new_dir(run_dir, "run_dir")
    hp = spec.hyperparameters
    seeds = [member_seed(hp.seed, i) for i in range(n_members)]
    # Build every member spec first: a bad input fails before anything is trained or written.
    specs = [member_spec(spec, s) for s in seeds]
    paths = [run_dir / f"member-{i}" for i in range(n_members)]
    if not spec.is_trading:  # the env id and env_kwargs too (cheap to check, unlike a market)
        from foxhunt.runs import make_envs

        make_envs(spec)

    def write_plan() -> None:
        """What `ensemble resume` needs if training stops part way, written once the first
        member's trainer is built (a bad market file fails before it, leaving nothing)."""
        if before_write is not None:
            before_write()
        run_dir.mkdir(parents=True, exist_ok=True)
        plan = {"members": n_members, "seeds": seeds}
        atomic_write_text(run_dir / PLAN_FILE, json.dumps(plan) + "\n")

    for i, (one_spec, path) in enumerate(zip(specs, paths, strict=True)):
        # before_write runs on the main process only (data-parallel workers write nothing).
        run_training(one_spec, path, progress=progress, before_write=write_plan if i == 0 else None)
    return _finish_ensemble(spec, run_dir, paths, seeds)


PLAN_FILE = "ensemble-plan.json"


def _finish_ensemble(
    spec: RunSpec, run_dir: Path, paths: list[Path], seeds: list[int]
) -> list[Path]:
    """Write ``config.yaml`` and the ``ensemble.json`` manifest once every member is trained."""
    from foxhunt import distributed

    if not distributed.current().is_main:
        return paths  # data-parallel worker: rank 0 writes the directory
    _check_same_data(paths)  # before anything is written: a refused ensemble stays as it was
    atomic_write_text(run_dir / "config.yaml", spec.to_yaml())
    record = paths[0] / DATA_FILE  # every member trained on the same market (just checked)
    if record.is_file():
        atomic_write_text(run_dir / DATA_FILE, record.read_text(encoding="utf-8"))
    manifest = {
        "format": ENSEMBLE_FORMAT,
        "format_version": ENSEMBLE_FORMAT_VERSION,
        "members": [{"path": p.name, "seed": s} for p, s in zip(paths, seeds, strict=True)],
    }
    atomic_write_text(run_dir / ENSEMBLE_FILE, json.dumps(manifest, indent=2))
    (run_dir / PLAN_FILE).unlink(missing_ok=True)
    return paths


def _check_same_data(paths: list[Path]) -> None:
    """Refuse an ensemble whose members trained on different data: members train one after
    another (and a resumed ensemble trains its missing members later), so the file behind
    ``market.data`` can change between them, and their Q-values would then not be comparable."""
    from foxhunt.runs import read_data_record

    def identity(path: Path) -> tuple[Any, ...] | None:
        record = read_data_record(path)
        keys = ("rows", "sha256", "train_end", "val_end")
        return None if record is None else tuple(record[k] for k in keys)

    first_path, first = paths[0], identity(paths[0])
    for path in paths[1:]:
        if identity(path) != first:
            raise DataError(
                f"ensemble members {first_path.name} and {path.name} trained on different data "
                f"({first_path / DATA_FILE} vs {path / DATA_FILE}): the data file changed while "
                "the ensemble trained; restore it and train the ensemble again"
            )


def resume_ensemble(run_dir: str | Path, *, progress: bool = False) -> list[Path]:
    """Finish an ensemble whose training stopped part way (Ctrl-C, SIGTERM, a crash).

    Trained members are kept; a member with a checkpoint resumes from it, exactly as a single
    run does; a member without one (it had just started, or had not) trains from the start.
    The result is the ensemble an uninterrupted ``train_ensemble`` writes. The caller's global
    RNGs are left as they were.
    """
    from foxhunt.session import caller_rng_state

    with caller_rng_state():
        return _resume_ensemble(run_dir, progress)


def _resume_ensemble(run_dir: str | Path, progress: bool) -> list[Path]:
    import shutil

    from foxhunt.markets._timestamps import midnight_offsets_in_utc
    from foxhunt.runs import check_same_data, read_data_record
    from foxhunt.session import assert_not_in_use, resume_training, run_training

    run_dir = Path(run_dir)
    if (run_dir / ENSEMBLE_FILE).is_file():
        raise FoxhuntError(f"{run_dir} is a complete ensemble: nothing to resume")
    plan_path = run_dir / PLAN_FILE
    if not plan_path.is_file():
        raise FoxhuntError(
            f"{run_dir} is not an ensemble stopped part way (no {PLAN_FILE}): start it with "
            "`foxhunt ensemble train`"
        )
    plan = read_json_object(plan_path, "ensemble plan")
    n_members = plan.get("members")
    if isinstance(n_members, bool) or not isinstance(n_members, int) or n_members < 2:
        raise FoxhuntError(
            f"{plan_path}: members must be an integer of at least 2, got: {n_members!r}"
        )
    if not (run_dir / "member-0" / "config.yaml").is_file():
        raise FoxhuntError(
            f"{run_dir}: no member started training; start it again with `foxhunt ensemble "
            "train --force`"
        )
    base = load_spec(run_dir / "member-0")  # member 0 trains with the ensemble's own seed
    hp = base.hyperparameters
    seeds = plan.get("seeds")
    if seeds is None:  # a plan from before member_seed: members were seeded seed + i
        seeds = [hp.seed + i for i in range(n_members)]
    valid = isinstance(seeds, list) and len(seeds) == n_members and seeds[:1] == [hp.seed]
    if not valid or not all(type(s) is int and 0 <= s < 2**32 for s in seeds):
        raise FoxhuntError(
            f"{plan_path}: seeds must be {n_members} integers in [0, 2**32), the first "
            f"member-0's seed {hp.seed}, got: {seeds!r:.80}"
        )
    if len(set(seeds)) < len(seeds):  # members of one seed are one model trained twice
        raise FoxhuntError(f"{plan_path}: seeds must differ, got: {seeds!r:.80}")
    paths = [run_dir / f"member-{i}" for i in range(n_members)]
    recorded = read_data_record(paths[0]) if base.is_trading else None
    # Members still to train must see member 0's market, read as member 0 read it.
    in_utc = recorded is not None and check_same_data(base, recorded)
    with midnight_offsets_in_utc() if in_utc else contextlib.nullcontext():
        for seed, path in zip(seeds, paths, strict=True):
            if (path / "summary.json").is_file() and (path / "model.safetensors").is_file():
                continue  # trained
            if (path / "checkpoints" / "latest.json").is_file():
                resume_training(path, progress=progress)
                continue
            if path.exists():
                assert_not_in_use(path)  # a member still training (its ensemble runs) is refused
                shutil.rmtree(path)  # started, but stopped before its first checkpoint
            run_training(member_spec(base, seed), path, progress=progress)
    return _finish_ensemble(base, run_dir, paths, seeds)


def require_limit_for_fallback(fallback_action: int | None, max_std: float | None) -> None:
    """Refuse a fallback that could never be taken: it applies only above ``max_std``."""
    if fallback_action is not None and max_std is None:
        raise ConfigError(
            f"fallback_action is taken only where the members disagree by more than max_std; "
            f"give max_std too, got fallback_action={fallback_action!r} and no max_std"
        )


def flat_action(positions: Sequence[float], max_std: float | None) -> int | None:
    """The trading fallback: the position nearest flat (smallest |p|), standing aside being the
    trader's "I don't know". None without ``max_std`` (no fallback is ever taken); refused where
    two positions are nearest (short or long of [-1, 1]: the fallback must be chosen)."""
    if max_std is None:
        return None
    smallest = min(abs(p) for p in positions)
    nearest = [i for i, p in enumerate(positions) if abs(p) == smallest]
    if len(nearest) > 1:
        raise ConfigError(
            f"positions {list(positions)} have no one position nearest flat to fall back on "
            f"where the members disagree: give fallback_action (one of 0..{len(positions) - 1})"
        )
    return nearest[0]


class _Recorder:
    """Wraps an ensemble policy and keeps each decision's uncertainty for the summary."""

    def __init__(
        self,
        ensemble: QEnsemble,
        risk_aversion: float,
        fallback_action: int | None,
        max_std: float | None,
    ) -> None:
        self.ensemble = ensemble
        self.kwargs: dict[str, Any] = dict(
            risk_aversion=risk_aversion, fallback_action=fallback_action, max_std=max_std
        )
        ensemble.policy(**self.kwargs)  # validates the arguments before any environment runs
        self.chosen_std: list[float] = []
        self.mean_std: list[float] = []
        self.disagreement: list[float] = []
        self.fell_back: list[bool] = []

    def __call__(self, obs: Any) -> int:
        d = self.ensemble.decide(obs, **self.kwargs)
        self.chosen_std.append(float(d.chosen_std[0]))
        self.mean_std.append(float(d.std[0].mean()))
        self.disagreement.append(float(d.disagreement[0]))
        self.fell_back.append(bool(d.fell_back[0]))
        return int(d.actions[0])

    def stats(self) -> dict[str, Any]:
        n = len(self.chosen_std)
        if n == 0:
            return {"decisions": 0}
        return {
            "decisions": n,
            "mean_disagreement": float(np.mean(self.disagreement)),
            "mean_chosen_std": float(np.mean(self.chosen_std)),
            "max_chosen_std": float(np.max(self.chosen_std)),
            "mean_std": float(np.mean(self.mean_std)),
            "fallback_rate": float(np.mean(self.fell_back)),
        }


def _jsonable(value: Any) -> Any:
    """Plain JSON values: NumPy scalars unwrapped, non-finite floats as null."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def evaluate_ensemble(
    run_dir: str | Path,
    *,
    split: str | None = None,
    risk_aversion: float = 0.0,
    max_std: float | None = None,
    fallback_action: int | None = None,
    data: str | Path | None = None,
    episodes: int | None = None,
) -> dict[str, Any]:
    """Backtest a trading ensemble (report in ``run_dir/backtest``, ``backtest_<split>`` for
    another split) or score a Gymnasium one.

    Trading: :func:`foxhunt.session.backtest_run` with the ensemble policy as the agent, plus each
    member alone on the same span (does the ensemble beat its members?) and the uncertainty over
    the span; ``fallback_action`` defaults to the flat position. The summary is also written to
    ``ensemble.json`` beside the report. Gymnasium: mean greedy return over ``episodes`` (the same
    episode seeds as ``foxhunt evaluate``), written to ``run_dir/evaluation.json``.
    """
    from foxhunt.session import _model_fits, backtest_run, check_evaluation_options, gym_evaluation

    run_dir = Path(run_dir)
    spec = load_spec(run_dir)
    episodes = check_evaluation_options(spec, run_dir, data=data, split=split, episodes=episodes)
    data = data_path(data)
    require_limit_for_fallback(fallback_action, max_std)
    ensemble = QEnsemble.load(run_dir)
    # The members were trained on the env config.yaml described then; one edited since fails
    # here in one line naming the file, not deep in a member's network.
    fits = _model_fits(ensemble.agents[0], run_dir / ensemble.names[0])
    settings: dict[str, Any] = {
        "members": ensemble.names,
        "risk_aversion": risk_aversion,
        "max_std": max_std,
    }
    if not spec.is_trading:
        rec = _Recorder(ensemble, risk_aversion, fallback_action, max_std)
        out = {
            "model": "final",  # every member's final weights
            **gym_evaluation(spec, rec, episodes, fits=fits),
            "ensemble": {**settings, "fallback_action": fallback_action, **rec.stats()},
        }
        atomic_write_text(run_dir / "evaluation.json", json.dumps(out, indent=2))
        return out

    from foxhunt import backtest as bt
    from foxhunt.runs import build_trading, model_policy, read_data_record

    config = spec.trading_config()
    if fallback_action is None:
        fallback_action = flat_action(config.positions, max_std)
    rec = _Recorder(ensemble, risk_aversion, fallback_action, max_std)
    split = "test" if split is None else split
    # One market for the ensemble, its baselines and its members: the detector is fitted once,
    # and every result is annualised with the same bars per year.
    setup = build_trading(spec, data_override=data, recorded=read_data_record(run_dir))
    summary = backtest_run(run_dir, spec, rec, data=data, split=split, setup=setup, fits=fits)
    span, ppy = setup.span(split, closing=True), summary["periods_per_year"]  # as backtest_run
    members = {
        name: bt.run_policy(span, model_policy(agent), config, name, periods_per_year=ppy).metrics
        for name, agent in zip(ensemble.names, ensemble.agents, strict=True)
    }
    summary["ensemble"] = {**settings, "fallback_action": fallback_action, **rec.stats()}
    summary["members"] = members
    text = json.dumps(_jsonable(summary), indent=2, allow_nan=False)
    atomic_write_text(Path(summary["metrics_file"]).parent / ENSEMBLE_FILE, text)
    return summary
