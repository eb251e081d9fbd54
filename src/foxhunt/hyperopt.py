"""Hyperparameter search with Optuna: a search space, an objective, and a shared-storage study.

Scaling out is Optuna's job, not ours: every process (or machine) that runs the same command with
the same ``storage`` URL joins one study, and the TPE sampler (with the constant liar, so running
trials are not re-proposed) coordinates them through that storage. A study remembers the task it
was created for, so a worker started with a different environment, step budget or base
configuration is refused instead of silently mixing incomparable trials.

Each trial trains a fresh :class:`~foxhunt.trainer.DQNTrainer` with its own seed (derived from the
run's seed and the trial number, so a trial is reproducible alone), reports every evaluation to the
median pruner, and returns the final greedy evaluation. ``best_config.yaml`` holds the exact
configuration of the best trial, seed included, so ``foxhunt train --config`` reproduces it.

A trial stopped by Ctrl-C, SIGTERM or SIGHUP is recorded as failed (the sampler ignores it: its
configuration was not judged) and queued to run again, with its seed, as the study's next trial.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import random
import re
import signal
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from foxhunt._io import atomic_write_text
from foxhunt.config import DQNHyperparameters
from foxhunt.errors import ConfigError, FoxhuntError, TrainingHalted, first_line, how_stopped
from foxhunt.runs import RunSpec, make_envs, require_spec
from foxhunt.trainer import DQNTrainer, final_env_steps, planned_updates

log = logging.getLogger("foxhunt.hyperopt")

GAMMAS = (0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999)
"""Discount choices (rl-baselines3-zoo's list): a grid, because returns depend on 1 - gamma."""
TARGET_UPDATE_INTERVALS = (1, 10, 100, 500, 1_000, 5_000)
"""Optimizer steps between target syncs."""
TRAIN_FREQS = (1, 4, 8, 16, 64, 256)
"""Environment steps between training rounds."""
N_STEPS = (1, 3, 5)
"""Multi-step return lengths."""
ACCUMULATION_STEPS = (1, 2, 4)
"""Micro-batches per optimizer step."""

# Hyperparameters that change where or how fast a trial runs, never what it learns: workers on
# different machines may differ in these and still share one study.
_SYSTEM_FIELDS = frozenset(
    {
        "device",
        "torch_threads",
        "vector_env",
        "compile",
        "replay_on_device",
        "log_interval",
        "checkpoint_interval",
        "keep_checkpoints",
    }
)

_ATTR_HP = "hyperparameters"
_ATTR_SEED = "seed"
_ATTR_REASON = "pruned_reason"
_ATTR_TASK = "foxhunt_task"
_ATTR_INTERRUPTED = "interrupted"
_ATTR_RERUN = "rerun_of"  # an interrupted trial's number, on the trial queued to run it again


# --- search space
def search_space(
    trial: optuna.Trial, base: DQNHyperparameters, fixed: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Suggest hyperparameters around ``base``; returns the fields to change on it.

    Names in ``fixed`` (what the user set with ``--set``) keep the base's value: a search never
    overrides a choice the user made explicitly.

    The space is built so every sample validates against ``base``: ``learning_starts`` and
    ``buffer_capacity`` are raised to the effective batch when it outgrows them, or, where the
    user fixed them, bound it (batch size and micro-batches are then one parameter,
    ``batch_size_x_accumulation``, offering the pairs that fit).
    Batch sizes and network widths are searched at half, equal and double the base values,
    because the base encodes what fits the user's memory and problem size. ``gradient_steps``
    follows ``train_freq`` at the base's updates-per-env-step ratio, so ``train_freq`` mostly
    decides how bursty the updates are, not how many; where the ratio asks for less than one
    update per ``train_freq`` (0.5 a step with ``train_freq`` 1) a trial does one, more than
    the base. Batch sizes and micro-batches still change what each update costs.
    """
    b = base.batch_size
    batch_choices = sorted({max(1, b // 2), b, 2 * b})
    # learning_starts or buffer_capacity kept by the user bound the effective batch: only
    # (batch, micro-batches) pairs within it are offered (others would be pruned as invalid).
    kept = [getattr(base, n) for n in ("learning_starts", "buffer_capacity") if n in fixed]
    cap = min(kept) if kept else None
    widest = max(base.hidden_sizes)
    width_choices = sorted({max(1, widest // 2), widest, 2 * widest})

    params: dict[str, Any] = {}

    def pick(name: str, suggest: Callable[[], Any]) -> None:
        params[name] = getattr(base, name) if name in fixed else suggest()

    pick("learning_rate", lambda: trial.suggest_float("learning_rate", 1e-5, 1e-2, log=True))
    both = {"batch_size", "gradient_accumulation_steps"}
    if cap is None or both <= fixed:
        pick("batch_size", lambda: trial.suggest_categorical("batch_size", batch_choices))
        pick(
            "gradient_accumulation_steps",
            lambda: trial.suggest_categorical(
                "gradient_accumulation_steps", list(ACCUMULATION_STEPS)
            ),
        )
    else:  # one parameter for the pair, so what Optuna records is what trains
        sizes = [base.batch_size] if "batch_size" in fixed else batch_choices
        steps = (
            [base.gradient_accumulation_steps]
            if "gradient_accumulation_steps" in fixed
            else list(ACCUMULATION_STEPS)
        )
        pairs = [f"{b}x{a}" for b in sizes for a in steps if b * a <= cap]
        pairs = pairs or [f"{base.batch_size}x{base.gradient_accumulation_steps}"]
        size, micro = trial.suggest_categorical("batch_size_x_accumulation", pairs).split("x")
        params["batch_size"], params["gradient_accumulation_steps"] = int(size), int(micro)
    pick("gamma", lambda: trial.suggest_categorical("gamma", list(GAMMAS)))
    pick(
        "target_update_interval",
        lambda: trial.suggest_categorical("target_update_interval", list(TARGET_UPDATE_INTERVALS)),
    )
    pick("max_grad_norm", lambda: trial.suggest_float("max_grad_norm", 0.1, 100.0, log=True))
    pick("n_step", lambda: trial.suggest_categorical("n_step", list(N_STEPS)))
    pick("dueling", lambda: trial.suggest_categorical("dueling", [False, True]))
    pick(
        "prioritized_replay",
        lambda: trial.suggest_categorical("prioritized_replay", [False, True]),
    )
    if not base.noisy_nets:  # noisy nets explore by themselves; epsilon is 0 throughout
        pick(
            "exploration_fraction",
            lambda: trial.suggest_float("exploration_fraction", 0.05, 0.5),
        )

    pick("train_freq", lambda: trial.suggest_categorical("train_freq", list(TRAIN_FREQS)))
    ratio = base.gradient_steps / base.train_freq
    pick("gradient_steps", lambda: max(1, round(params["train_freq"] * ratio)))

    def widths() -> tuple[int, ...]:
        scale = trial.suggest_categorical("hidden_width", width_choices) / widest
        return tuple(max(1, round(h * scale)) for h in base.hidden_sizes)

    pick("hidden_sizes", widths)

    eff = params["batch_size"] * params["gradient_accumulation_steps"]
    pick("learning_starts", lambda: max(base.learning_starts, eff))
    pick("buffer_capacity", lambda: max(base.buffer_capacity, eff))
    return params


def trial_seed(run_seed: int, trial_number: int) -> int:
    """An independent, reproducible seed per trial (NumPy SeedSequence of run seed and number)."""
    state = np.random.SeedSequence([run_seed, trial_number]).generate_state(1)[0]
    return int(state) & 0x7FFF_FFFF


def _prune(trial: optuna.Trial, reason: str) -> optuna.TrialPruned:
    """Record why (shown in trials.csv) and build the exception that ends the trial."""
    reason = " ".join(reason.split())
    trial.set_user_attr(_ATTR_REASON, reason)
    log.info("trial %d pruned: %s", trial.number, reason)
    return optuna.TrialPruned(reason)


class TrialInterrupted(Exception):
    """Ends a trial stopped by a signal as failed (Optuna's convention for a trial that did not
    finish: the sampler learns nothing from it); ``signum`` says which signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(how_stopped(signum))
        self.signum = signum


# --- objective
def objective(
    trial: optuna.Trial,
    spec: RunSpec,
    *,
    envs: tuple[Any, Any, Any] | None = None,
    fixed: frozenset[str] = frozenset(),
) -> float:
    """Train one sampled configuration for ``spec.total_env_steps``; return its greedy return.

    ``envs`` (the output of :func:`foxhunt.runs.make_envs`) may be passed to reuse one market
    preparation across trials; it is deterministic given the spec, so reuse changes nothing.
    Invalid samples, runs in which no update could happen, health-monitor halts and non-finite
    results are pruned with the reason in the ``pruned_reason`` user attribute: pruned rather
    than failed so the sampler learns to avoid those regions.
    """
    base = spec.hyperparameters
    trainer: DQNTrainer | None = None
    try:
        # All of it, not the training alone: a Ctrl-C lands as often in the seconds of a
        # trainer's first build (lazy imports) or a storage write.
        # A re-run of an interrupted trial trains what that trial would have: its seed too.
        seed = trial_seed(base.seed, int(trial.user_attrs.get(_ATTR_RERUN, trial.number)))
        trial.set_user_attr(_ATTR_SEED, seed)
        try:
            hp = base.replace(**search_space(trial, base, fixed), seed=seed)
        except ConfigError as err:
            raise _prune(trial, f"invalid configuration: {err}") from None
        trial.set_user_attr(_ATTR_HP, hp.to_dict())
        if planned_updates(0, spec.total_env_steps, hp) == 0:
            reached = final_env_steps(0, spec.total_env_steps, hp.n_envs)
            raise _prune(
                trial,
                f"no optimizer step would run: the {reached} env steps a trial reaches "
                f"(total_env_steps {spec.total_env_steps}) end before a train_freq boundary "
                f"(every {hp.train_freq}) at or after learning_starts {hp.learning_starts}",
            )
        train_env, eval_env, _ = envs if envs is not None else make_envs(spec)
        trainer = DQNTrainer(hp, train_env, eval_env=eval_env)

        def report(row: dict[str, Any]) -> None:
            value = row.get("eval_return")
            if value is None:
                return
            step = int(row["env_steps"])
            if not math.isfinite(value):
                raise _prune(trial, f"non-finite evaluation return {value} at env step {step}")
            trial.report(float(value), step)
            # At the end of its budget a trial completes: pruning it then saves nothing and
            # hides its final value from the sampler.
            if step < spec.total_env_steps and trial.should_prune():
                raise _prune(
                    trial, f"pruner stopped it at env step {step} (eval return {value:.6g})"
                )

        trainer.learn(spec.total_env_steps, callback=report)
        value = trainer.evaluate()
    except TrainingHalted as err:
        raise _prune(trial, f"training halted: {err}") from None
    except KeyboardInterrupt as err:
        # Ctrl-C, SIGTERM or SIGHUP: end this trial as failed, queue its configuration to run
        # again and stop the study after it, so the trials already finished still reach
        # trials.csv and best_config.yaml (the caller re-raises after, with the signal, so the
        # CLI exits 130 or 143 as a training run does). Pruned, it would have counted as a bad
        # configuration, and never run again.
        signum = int(getattr(err, "signum", 0) or signal.SIGINT)
        trial.study.stop()
        trial.set_user_attr(_ATTR_INTERRUPTED, signum)
        reason = how_stopped(signum)
        if trial.params:  # none yet: the next trial samples afresh
            first = int(trial.user_attrs.get(_ATTR_RERUN, trial.number))
            trial.study.enqueue_trial(dict(trial.params), user_attrs={_ATTR_RERUN: first})
            reason += "; queued to run again as the study's next trial"
        trial.set_user_attr(_ATTR_REASON, reason)
        log.info("trial %d stopped: %s", trial.number, reason)
        raise TrialInterrupted(signum) from None
    finally:
        if trainer is not None:
            trainer.close()
    if not math.isfinite(value):
        raise _prune(trial, f"non-finite final evaluation return {value}")
    return value


# --- storage and study
def _redact(url: str) -> str:
    """The URL without its password, for messages and summaries."""
    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return url


def open_storage(storage: str | None) -> optuna.storages.BaseStorage | str | None:
    """Resolve a storage URL: ``journal:PATH`` (a journal file, NFS-safe locking), ``redis://``
    (journal on Redis) or any SQLAlchemy URL (``sqlite:///study.db``, ``postgresql://...``).

    Only a database gets heartbeats (Optuna's journal storage has none): there, the trial of a
    worker killed outright (SIGKILL, a machine lost) is marked failed when the next trial
    starts; in a journal it stays RUNNING."""
    if storage is None:
        return None
    if not isinstance(storage, str) or not storage.strip():
        raise ConfigError(f"storage must be an Optuna storage URL, got: {storage!r}")
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalRedisBackend

    if re.fullmatch(r"sqlite(\+\w+)?:///?(:memory:)?", storage.strip()):
        raise ConfigError(
            f"storage must be shared to be worth giving, got the in-memory {storage!r} (nothing "
            "outlives the process or reaches another): sqlite:///study.db, or no --storage for "
            "a search in one process"
        )
    try:
        if (path := _journal_path(storage)) is not None:
            if not path:
                raise ValueError("journal storage needs a file path (journal:PATH)")
            return JournalStorage(JournalFileBackend(path))
        if storage.startswith(("redis://", "rediss://")):
            with warnings.catch_warnings():  # "experimental", two lines before any error
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return JournalStorage(JournalRedisBackend(storage))
    except (OSError, ImportError, ValueError) as err:
        raise ConfigError(
            f"storage cannot be opened, got: {storage!r} ({first_line(err)})"
        ) from None
    return storage  # an RDB URL: _open_study builds (and validates) it, with heartbeats


# SQLAlchemy's driver names and the packages that provide them.
_DRIVERS = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "pymysql": "pymysql",
    "mysqldb": "mysqlclient",
    "mysqlconnector": "mysql-connector-python",
}


def _storage_reason(err: BaseException, storage: str | None) -> str:
    """Why a storage did not open, in one line; a missing database driver is named."""
    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    reason = first_line(err)
    if "Failed to import DB access module" in reason and storage:
        try:  # the driver SQLAlchemy would import for this URL (its default for the dialect)
            driver = make_url(storage).get_dialect().driver
        except (sqlalchemy.exc.SQLAlchemyError, ValueError, ImportError):
            driver = None
        if driver in _DRIVERS:
            reason = f"its database driver is not installed: pip install {_DRIVERS[driver]}"
    if isinstance(err, optuna.exceptions.StorageInternalError):
        reason = f"{reason.rstrip('.')}; is the database read-only?"
    return reason


def _journal_path(storage: str) -> str | None:
    """The file of a ``journal:PATH`` (or ``journal://PATH``) storage; None for other URLs."""
    if not storage.startswith("journal:"):
        return None
    path = storage[len("journal:") :]
    return path[2:] if path.startswith("//") else path


_OPEN_ATTEMPTS = 6
_HEARTBEAT_S = 60


def _creation_race(err: BaseException) -> bool:
    """Whether opening a storage failed only because another worker was creating it too."""
    import sqlalchemy.exc

    text = str(err).lower()
    if isinstance(err, sqlalchemy.exc.IntegrityError):
        return True
    return isinstance(err, sqlalchemy.exc.OperationalError) and (
        "already exists" in text or "locked" in text
    )


class StudyInterrupted(KeyboardInterrupt):
    """A study stopped by Ctrl-C or SIGTERM (``signum``) once its files were written."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"study stopped by signal {signum}")
        self.signum = signum


def _task(spec: RunSpec, fixed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What makes two trials comparable: the environment, budget, non-system hyperparameters
    and which of them the search leaves fixed (a value that happens to equal the searched
    one's default is still a different search)."""
    data = spec.model_dump(mode="json")
    data["hyperparameters"] = {
        k: v for k, v in data["hyperparameters"].items() if k not in _SYSTEM_FIELDS
    }
    data["fixed"] = sorted(set(fixed) - _SYSTEM_FIELDS)
    return data


def _diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}={vb!r} (study has {va!r})")
    return out


def _open_study(
    spec: RunSpec,
    storage: str | None,
    study_name: str,
    sampler_seed: int | None,
    fixed: frozenset[str] = frozenset(),
) -> optuna.Study:
    import sqlalchemy.exc

    resolved = open_storage(storage)
    sampler = _sampler(sampler_seed)
    # Trials are judged only after 20 % of their budget, when learning has had a chance to start.
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=5, n_warmup_steps=spec.total_env_steps // 5
    )
    shown = _redact(storage) if storage is not None else None
    for attempt in range(_OPEN_ATTEMPTS):
        try:
            backend = resolved
            if isinstance(resolved, str):
                # A database: every worker's running trial beats every minute, and one silent
                # for three (a worker killed or its machine lost) is marked failed when the next
                # trial starts, instead of staying RUNNING in the study for ever.
                with warnings.catch_warnings():  # "experimental" since Optuna 2.9, and said so
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    backend = optuna.storages.RDBStorage(
                        resolved, heartbeat_interval=_HEARTBEAT_S, grace_period=3 * _HEARTBEAT_S
                    )
            study = optuna.create_study(
                storage=backend,
                sampler=sampler,
                pruner=pruner,
                study_name=study_name,
                direction="maximize",
                load_if_exists=True,
            )
            stored = study.user_attrs.get(_ATTR_TASK)
            break
        except (
            sqlalchemy.exc.SQLAlchemyError,
            optuna.exceptions.StorageInternalError,  # a commit refused: a read-only file
            ImportError,
            ValueError,
            OSError,
        ) as err:
            if _creation_race(err) and attempt + 1 < _OPEN_ATTEMPTS:
                # Workers started together race to create a new database's tables (a UNIQUE
                # constraint on alembic_version, "table already exists", a locked file): the
                # loser finds them made on the next try.
                time.sleep(0.2 * (attempt + 1) * (1.0 + random.random()))
                continue
            raise ConfigError(
                f"storage cannot be opened, got: {shown!r} ({_storage_reason(err, storage)})"
            ) from None
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        raise ConfigError(
            f"study_name {study_name!r} in storage {shown!r} minimizes, got it for "
            f"foxhunt, which maximizes the evaluation return"
        )
    task = _task(spec, fixed)
    if isinstance(stored, dict) and "fixed" not in stored:
        task.pop("fixed")  # a study recorded before the fixed names were: compare the rest
    if stored is None:
        study.set_user_attr(_ATTR_TASK, task)
    elif stored != task:
        diffs = _diff(stored, task)
        hint = ""
        if not spec.is_trading and any(d.startswith("hyperparameters.") for d in diffs):
            hint = "; a study made before Gymnasium envs trained from the classic preset needs "
            hint += "--preset default"
        raise ConfigError(
            f"study_name {study_name!r} in storage {shown!r} was created for "
            f"another run, got: {'; '.join(diffs[:3])} (use another --study-name{hint})"
        )
    already = len(study.get_trials(deepcopy=False))
    if sampler_seed is not None and already:
        # Continuing a study: the seed alone would draw the first trials' random start-up
        # configurations again. With the trials already there, it draws new ones, as
        # reproducibly.
        study.sampler = _sampler(sampler_seed, already)
    return study


def _sampler(seed: int | None, trials_before: int = 0) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, with the constant liar so workers' running trials are not proposed
    again), seeded from ``seed`` and the number of trials the study held before this process."""
    if seed is not None and trials_before:
        seed = int(np.random.SeedSequence([seed, trials_before]).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


# --- results
def _trials_csv(study: optuna.Study) -> str:
    """One row per trial: state, value, seed, duration, why it was pruned or failed, and params."""
    trials = study.get_trials(deepcopy=False)
    names = sorted({n for t in trials for n in t.params})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["number", "state", "value", "seed", "duration_s", "reason", *(f"param_{n}" for n in names)]
    )
    for t in trials:
        reason = t.user_attrs.get(_ATTR_REASON) or t.system_attrs.get("fail_reason") or ""
        if not reason and t.state == optuna.trial.TrialState.FAIL:
            # Marked failed by the storage's heartbeat check: no process said why.
            reason = "its worker stopped (killed or lost) while it ran"
        if not reason and _ATTR_RERUN in t.user_attrs:
            reason = f"runs trial {t.user_attrs[_ATTR_RERUN]} again (it was interrupted)"
        duration = t.duration.total_seconds() if t.duration is not None else None
        w.writerow(
            [
                t.number,
                t.state.name,
                "" if t.value is None else repr(t.value),
                t.user_attrs.get(_ATTR_SEED, ""),
                "" if duration is None else f"{duration:.3f}",
                " ".join(str(reason).split()),
                *("" if t.params.get(n) is None else t.params[n] for n in names),
            ]
        )
    return buf.getvalue()


def _best_config_yaml(
    spec: RunSpec,
    hp: DQNHyperparameters,
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    n_complete: int,
) -> str:
    best_spec = spec.model_copy(update={"hyperparameters": hp})
    if spec.is_trading and spec.market.detector_seed is None:
        # Every trial traded the market as fitted with the search's seed (make_envs(spec),
        # built once); the trial's own seed would fit the HMM another way.
        market = spec.market.model_copy(update={"detector_seed": spec.hyperparameters.seed})
        best_spec = best_spec.model_copy(update={"market": market})
    header = (
        f"# foxhunt hyperopt: best of {n_complete} complete trials in study "
        f"{study.study_name!r}: trial {trial.number}, final greedy evaluation return "
        f"{trial.value:.6g}\n"
        f"# (on the training evaluation's episode seeds; `foxhunt evaluate` scores held-out ones)\n"
        f"# Reproduce or reuse it: foxhunt train --config best_config.yaml\n"
    )
    return header + best_spec.to_yaml()


STUDY_FILE = "study.json"


def study_identity(study_name: str, storage: str | None) -> dict[str, Any]:
    """Which study a run directory's files describe (``study.json``): a later search may write
    there only to continue that stored study, or the files would mix two searches."""
    return {"study_name": study_name, "storage": _canonical(storage) if storage else None}


def _canonical(storage: str) -> str:
    """The storage a URL names, whatever the working directory: a SQLite file or a journal by
    its absolute path (``sqlite:///s.db`` from two directories is two studies), password
    hidden."""
    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    if (path := _journal_path(storage)) is not None:
        return "journal:" + str(Path(path).resolve())  # no ~: Optuna does not expand it either
    try:
        url = make_url(storage)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return storage
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        url = url.set(database=str(Path(url.database).resolve()))
    return url.render_as_string(hide_password=True)


def check_search_dir(path: Path, study_name: str, storage: str | None, force: bool) -> None:
    """A search writes into a directory holding results only to continue the stored study they
    describe (``study.json``); anything else would overwrite them with another search's. The
    options are named as the CLI spells them (``force``: ``--force``)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--run-dir must be a directory, got a file: {path}")
    # A training run or an ensemble is never a search's directory, --force or not.
    other = [n for n in ("config.yaml", "ensemble.json", "checkpoints") if (path / n).exists()]
    if other:
        raise ConfigError(
            f"--run-dir {path} holds a training run or an ensemble ({', '.join(other)}): give "
            "the search a directory of its own"
        )
    # A search that completed no trial leaves trials.csv (its pruning reasons) but no results:
    # the corrected retry may write over it.
    held = [n for n in ("best_config.yaml", "trials.csv") if (path / n).is_file()]
    if force or not (path / "best_config.yaml").is_file():
        return
    try:
        recorded = json.loads((path / STUDY_FILE).read_text())
    except (OSError, ValueError):
        recorded = None
    # Written before the storage was recorded by its absolute path: the URL as given.
    legacy = {"study_name": study_name, "storage": _redact(storage) if storage else None}
    if storage is not None and recorded in (study_identity(study_name, storage), legacy):
        return  # continuing the same stored study: the files will describe all of it
    raise ConfigError(
        f"--run-dir already holds another search's results ({', '.join(held)} in {path}): "
        "another --run-dir, --force to replace them, or the same --storage and --study-name "
        "to continue a stored study"
    )


def run_hyperopt(
    spec: RunSpec,
    *,
    n_trials: int,
    storage: str | None = None,
    study_name: str = "foxhunt",
    run_dir: str | Path | None = None,
    sampler_seed: int | None = None,
    fixed: frozenset[str] | set[str] = frozenset(),
    force: bool = False,
) -> dict[str, Any]:
    """Run ``n_trials`` trials in this process against the (possibly shared) study.

    ``fixed``: hyperparameter names the search leaves at ``spec``'s values (``--set`` ones).
    ``run_dir`` may hold another search's results only with ``force`` (or to continue the
    stored study they describe), and never a training run or an ensemble.

    With ``storage`` every process that runs the same call joins one study (that is how search
    scales out); ``n_trials`` counts this process's trials. Give each process its own
    ``sampler_seed`` (or none), or their first, random trials coincide. The summary and
    ``best_config.yaml`` describe the best trial of the whole study. Files in ``run_dir``
    (``best_config.yaml``, ``trials.csv``) are written atomically.
    """
    require_spec(spec)
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials <= 0:
        raise ConfigError(f"n_trials must be a positive integer, got: {n_trials!r}")
    bad_seed = isinstance(sampler_seed, bool) or not isinstance(sampler_seed, int | None)
    if bad_seed or (sampler_seed is not None and not 0 <= sampler_seed < 2**32):
        raise ConfigError(
            f"sampler_seed must be None or an integer in [0, 2**32), got: {sampler_seed!r}"
        )
    if not isinstance(study_name, str) or not study_name.strip():
        raise ConfigError(f"study_name must be a non-empty string, got: {study_name!r}")
    out_dir = Path(run_dir) if run_dir is not None else None
    if out_dir is not None:  # never over a run, an ensemble or another search's results
        check_search_dir(out_dir, study_name, storage, force)

    unknown = sorted(set(fixed) - set(DQNHyperparameters.model_fields))
    if unknown:
        raise ConfigError(f"fixed names unknown hyperparameter(s): {', '.join(unknown)}")
    frozen = frozenset(fixed)
    _check_budget(spec)
    envs = make_envs(spec)  # validates the environment / market before any trial starts
    study = _open_study(spec, storage, study_name, sampler_seed, frozen)
    interrupted = 0  # the signal that stopped this process's study; 0 while none did

    def run_trial(trial: optuna.Trial) -> float:
        nonlocal interrupted
        try:
            return objective(trial, spec, envs=envs, fixed=frozen)
        except TrialInterrupted as err:
            interrupted = interrupted or err.signum
            raise

    from foxhunt.session import caller_rng_state

    try:
        with caller_rng_state(), _quiet_interrupted_trials():  # trainers seed the global RNGs
            study.optimize(run_trial, n_trials=n_trials, catch=(TrialInterrupted,))
    except KeyboardInterrupt as err:
        # Between trials (Optuna's own bookkeeping): the finished trials still get their files.
        interrupted = interrupted or int(getattr(err, "signum", 0) or signal.SIGINT)

    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    files: dict[str, str] = {}
    if out_dir is not None:
        atomic_write_text(out_dir / "trials.csv", _trials_csv(study))
        files["trials"] = str(out_dir / "trials.csv")
        identity = json.dumps(study_identity(study_name, storage), indent=2) + "\n"
        atomic_write_text(out_dir / STUDY_FILE, identity)
    if interrupted and not complete:
        raise StudyInterrupted(interrupted)
    if not complete:
        reasons = Counter(t.user_attrs.get(_ATTR_REASON, "failed") for t in trials)
        common = reasons.most_common(1)[0][0] if reasons else "no trials"
        raise FoxhuntError(
            f"no trial completed in study {study_name!r} ({len(trials)} trials; "
            f"most common reason: {common})"
        )
    best = study.best_trial
    best_hp = DQNHyperparameters(**best.user_attrs[_ATTR_HP])
    if out_dir is not None:
        text = _best_config_yaml(spec, best_hp, study, best, len(complete))
        atomic_write_text(out_dir / "best_config.yaml", text)
        files["best_config"] = str(out_dir / "best_config.yaml")
    summary: dict[str, Any] = {
        "study_name": study_name,
        "storage": _redact(storage) if storage is not None else None,
        "trials": len(trials),
        "complete": states.get("COMPLETE", 0),
        "pruned": states.get("PRUNED", 0),
        "failed": states.get("FAIL", 0),
        "best_trial": best.number,
        "best_value": best.value,
        "best_params": dict(best.params),
        "best_hyperparameters": best_hp.to_dict(),
        "files": files,
    }
    if interrupted:  # the files describe the trials finished before Ctrl-C
        log.warning("hyperopt interrupted: %d trial(s) complete, files written", len(complete))
        raise StudyInterrupted(interrupted)
    return summary


def _check_budget(spec: RunSpec) -> None:
    """Refuse a budget no trial can learn in: the search never lowers ``learning_starts``, so a
    run ending before it would prune every trial, one by one, for as many as were asked."""
    hp = spec.hyperparameters
    reached = final_env_steps(0, spec.total_env_steps, hp.n_envs)
    if reached < hp.learning_starts:
        raise ConfigError(
            f"total_env_steps {spec.total_env_steps} ends before learning_starts "
            f"{hp.learning_starts} (the search never lowers it): no trial could run an optimizer "
            "step; raise --total-steps or lower learning_starts with --set"
        )


class _QuietInterruptedTrials(logging.Filter):
    """Drops Optuna's "Trial N failed ..." records (a traceback, then the value) for a trial that
    a signal stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.trials: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        number = re.match(r"Trial (\d+) failed", record.getMessage())
        if number and record.exc_info and isinstance(record.exc_info[1], TrialInterrupted):
            self.trials.add(number[1])
        return not (number and number[1] in self.trials)


@contextmanager
def _quiet_interrupted_trials() -> Iterator[None]:
    """Optuna logs a failed trial with its traceback; one stopped by a signal is not an error
    (trials.csv says what happened to it), so its records are dropped."""
    logger = logging.getLogger("optuna.study._optimize")
    quiet = _QuietInterruptedTrials()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
