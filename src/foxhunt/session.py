"""Run-level orchestration: train into a run directory, resume it exactly, evaluate it.

Order matters for "nothing is lost": every input is validated and the environments and trainer are
built *before* the run directory is created, so a bad input leaves no partial output behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from foxhunt._io import atomic_write_text, shell_quoted
from foxhunt.config import DQNHyperparameters
from foxhunt.errors import ConfigError, FoxhuntError, TrainingHalted, first_line
from foxhunt.learner import DQNAgent
from foxhunt.logging import say
from foxhunt.runs import (
    HALTED_FILE,
    RunSpec,
    TradingSetup,
    check_split,
    data_path,
    halted_hint,
    load_model,
    load_spec,
    make_envs,
    model_policy,
    read_data_record,
    refuse_other_dir,
    require_spec,
    save_model,
    summary_env_steps,
    write_data_record,
)
from foxhunt.trainer import (
    NO_STEP_LIMIT,
    DQNTrainer,
    episode_returns,
    evaluation_step_limit,
    planned_updates,
)
from foxhunt.trainstate import capture_state, restore_state

if TYPE_CHECKING:
    from foxhunt.logging import MetricLogger

log = logging.getLogger("foxhunt.session")


try:  # POSIX advisory locks; elsewhere a second writer is not detected.
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - Windows
    _fcntl = None  # type: ignore[assignment]

_LOCK_FILE = ".foxhunt.lock"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for one training process from start to end.

    A second ``train --force``, ``resume`` or ``train`` into the same directory while one is
    running is refused in one line instead of overwriting (or deleting) the live run's files.
    The lock is the kernel's (``flock``), so a killed process releases it.
    """
    if _fcntl is None:  # pragma: no cover - Windows
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / _LOCK_FILE, "a+") as fh:
        try:
            _fcntl.flock(fh.fileno(), _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        except BlockingIOError:
            raise FoxhuntError(
                f"run directory {run_dir} is in use by another foxhunt process; wait for it "
                "to finish or stop it first"
            ) from None
        try:
            yield
        finally:
            _fcntl.flock(fh.fileno(), _fcntl.LOCK_UN)


def assert_not_in_use(run_dir: Path) -> None:
    """Refuse when another process holds ``run_dir`` (checked before ``--force`` deletes it)."""
    if (run_dir / _LOCK_FILE).is_file():
        with run_lock(run_dir):
            pass


class TrainerCheckpointer:
    """Connects a trainer to a :class:`~foxhunt.checkpoint.CheckpointManager`."""

    def __init__(self, run_dir: Path, spec: RunSpec) -> None:
        from foxhunt.checkpoint import CheckpointManager

        self.manager = CheckpointManager(run_dir, keep_last=spec.hyperparameters.keep_checkpoints)
        self.run = _run_sections(spec)

    def save(self, trainer: DQNTrainer) -> Path:
        from foxhunt import distributed

        tensors, state = capture_state(trainer)
        # What the environment was built from (checked on resume), and how many processes
        # trained: a data-parallel checkpoint holds rank 0's state only.
        state["run"] = {**self.run, "world_size": distributed.current().world_size}
        return self.manager.save(tensors, state, step=trainer.env_steps)


def _run_sections(spec: RunSpec) -> dict[str, Any]:
    """The parts of a run's config that build its environment (not its step budget)."""
    data = spec.model_dump(mode="json")
    return {k: data[k] for k in ("env", "env_kwargs", "market", "trading")}


def _check_same_environment(run_dir: Path, spec: RunSpec, state: dict[str, Any]) -> None:
    """Refuse a resume whose config.yaml now builds another environment than the checkpoint's
    (an edited market seed, data file, cost...): the run would silently continue on other data."""
    saved = state.get("run")
    if not isinstance(saved, dict):
        return  # a checkpoint from before this check
    now = _run_sections(spec)
    for section in ("env", "env_kwargs", "market", "trading"):
        # env_kwargs came later: a checkpoint without it was made with none.
        old = saved.get(section, {} if section == "env_kwargs" else None)
        if old != now[section]:
            new = now[section]
            if isinstance(old, dict) and isinstance(new, dict):
                key = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))[0]
                section, old, new = f"{section}.{key}", old.get(key), new.get(key)
            raise FoxhuntError(
                f"{run_dir / 'config.yaml'}: {section} is {new!r} but the checkpoint was trained "
                f"with {old!r}; restore it, or start a new run"
            )


def _build_trainer(
    spec: RunSpec,
    run_dir: Path,
    *,
    progress: bool,
    resuming: bool = False,
    purpose: Literal["evaluate", "resume"] = "resume",
) -> tuple[DQNTrainer, TradingSetup | None]:
    """The trainer and the trading market it trains on (None for a Gymnasium env).

    ``resuming``: the run's data must be the very data its record (``data.json``) describes,
    or, for ``purpose="evaluate"`` (a checkpoint read for its weights), that data grown by new
    bars or revised, as an evaluate accepts it.
    """
    # rich draws from Python's global RNG when first imported (rich.style's link ids). Import it
    # before the trainer seeds (or a resume restores) that RNG, so the progress display, which
    # imports rich lazily, cannot make a resumed run's RNG state differ from the straight run's.
    import rich.style  # noqa: F401

    recorded = read_data_record(run_dir) if resuming and spec.is_trading else None
    train_env, eval_env, setup = make_envs(spec, recorded=recorded, purpose=purpose)
    trainer = DQNTrainer(spec.hyperparameters, train_env, eval_env=eval_env, progress=progress)
    return trainer, setup


def _finished(run_dir: Path, trainer: DQNTrainer) -> bool:
    """Whether the run's model and summary are those of the trainer's env step (an extension
    stopped part way leaves the previous, shorter run's in place)."""
    if not all((run_dir / n).is_file() for n in ("model.json", "model.safetensors")):
        return False
    return summary_env_steps(run_dir) == trainer.env_steps


def _finish(trainer: DQNTrainer, run_dir: Path, summary: dict[str, Any], spec: RunSpec) -> None:
    positions = spec.trading_config().positions if spec.is_trading else None
    save_model(run_dir, trainer.agent, best_state=trainer.best_state, positions=positions)
    summary = {**summary, "health": [e.__dict__ for e in trainer.health.events]}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=float))
    (run_dir / HALTED_FILE).unlink(missing_ok=True)  # a halt that a resume has since got past


def _record_halt(trainer: DQNTrainer, run_dir: Path, exc: TrainingHalted) -> None:
    """Keep why a health monitor stopped the run beside its metrics: the one line on stderr is
    gone with the terminal (``foxhunt report`` shows it; a finished resume removes it)."""
    record = {
        "message": str(exc),
        "env_steps": trainer.env_steps,
        "optimizer_steps": trainer.agent.optimizer_steps,
        "health": [e.__dict__ for e in trainer.health.events],
    }
    atomic_write_text(run_dir / HALTED_FILE, json.dumps(record, indent=2, default=float))


def _train_loop(trainer: DQNTrainer, spec: RunSpec, run_dir: Path, total: int) -> dict[str, Any]:
    from foxhunt.logging import print_summary

    try:
        summary = trainer.learn(total)
    except TrainingHalted as exc:
        # The last good checkpoint stays in place (no new save: the weights may be bad).
        trainer._checkpointer = None
        _record_halt(trainer, run_dir, exc)
        raise
    finally:
        if trainer.logger is not None:
            trainer.logger.close()
        trainer.close()
    _finish(trainer, run_dir, summary, spec)
    # Printed with or without the live display: it is where the run went and what it did.
    print_summary({k: v for k, v in summary.items() if not isinstance(v, list)})
    best, last = summary.get("best_eval_return"), summary.get("last_eval_return")
    if best is not None and last is not None and best > last:
        # evaluate scores the final weights by default; say where the better ones are kept.
        say(
            f"foxhunt: the best evaluation ({best:.4g}) beat the last ({last:.4g}); its weights "
            f"are kept: `foxhunt evaluate {shell_quoted(run_dir)} --model best`"
        )
    return summary


# (settings, when they apply, why not otherwise): a setting given a value of its own where it
# does not apply is reported, never silently dropped.
_APPLIES: tuple[tuple[tuple[str, ...], Callable[[DQNHyperparameters], bool], str], ...] = (
    (
        ("exploration_initial_eps", "exploration_final_eps", "exploration_fraction"),
        lambda hp: not hp.noisy_nets,
        "noisy_nets explores through its noise and acts without epsilon",
    ),
    (("noisy_sigma0",), lambda hp: hp.noisy_nets, "noisy_nets is off"),
    (("loss",), lambda hp: hp.distributional == "none", "distributional heads set their loss"),
    (
        ("huber_delta",),
        lambda hp: hp.distributional == "qr"
        or (hp.distributional == "none" and hp.loss == "huber"),
        "no Huber loss is used (C51, or loss=mse)",
    ),
    (("n_atoms",), lambda hp: hp.distributional != "none", "distributional is 'none'"),
    (("v_min", "v_max"), lambda hp: hp.distributional == "c51", "only C51 has a fixed support"),
    (("momentum",), lambda hp: hp.optimizer in ("sgd", "rmsprop"), "Adam has no momentum"),
    (("adam_eps",), lambda hp: hp.optimizer != "sgd", "SGD has no eps"),
    (("lr_decay_steps", "lr_final_ratio"), lambda hp: hp.lr_schedule in ("linear", "cosine"),
     "lr_schedule is neither linear nor cosine"),
    (("lr_step_size", "lr_step_gamma"), lambda hp: hp.lr_schedule == "step",
     "lr_schedule is not 'step'"),
    (("per_alpha", "per_beta_start", "per_beta_end", "per_beta_fraction", "per_eps"),
     lambda hp: hp.prioritized_replay, "prioritized_replay is off"),
    (("regime_gating", "regime_in_torso"), lambda hp: hp.regime_conditional,
     "regime_conditional is off"),
)  # fmt: skip


# Defaults that changed: every config.yaml written before holds them (all fields are written
# out), and reusing one is no sign the user chose that value.
_FORMER_DEFAULTS: dict[str, Any] = {"lr_decay_steps": 100_000}


def ignored_settings(hp: DQNHyperparameters) -> list[tuple[list[str], str]]:
    """Settings holding a value of their own (not the default) where they have no effect, with
    the reason: ``[(names, why), ...]``."""
    fields = type(hp).model_fields
    out = []
    for names, applies, why in _APPLIES:
        if applies(hp):
            continue
        given = [
            k
            for k in names
            if getattr(hp, k) not in (fields[k].default, _FORMER_DEFAULTS.get(k, fields[k].default))
        ]
        if names[0].startswith("exploration"):
            # Epsilon 0 agrees with noisy nets, and then the schedule's length is moot too.
            off = hp.exploration_initial_eps == hp.exploration_final_eps == 0.0
            given = [k for k in given if getattr(hp, k) != 0.0 and not off]
        if given:
            out.append((given, why))
    return out


def run_training(
    spec: RunSpec,
    run_dir: Path,
    *,
    progress: bool = True,
    before_write: Callable[[], None] | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    """Train a fresh run into ``run_dir`` (config, metrics, checkpoints, final model).

    ``before_write`` runs once the trainer is built (every input validated) and before anything
    is written: ``foxhunt train --force`` removes the old run there, so a bad input keeps it.
    ``origin`` says where the hyperparameters came from (preset, config file, ``--set``), for
    the run line.
    """
    from foxhunt import distributed

    info = distributed.current()
    hp = spec.hyperparameters
    trainer, setup = _build_trainer(spec, run_dir, progress=progress and info.is_main)
    for names, why in ignored_settings(hp):
        log.warning("%s ignored: %s", ", ".join(f"{k}={getattr(hp, k)}" for k in names), why)
    if not info.is_main:  # data-parallel worker: trains in lockstep, writes nothing
        try:
            return trainer.learn(spec.total_env_steps)
        finally:
            trainer.close()
    if before_write is not None:
        assert_not_in_use(run_dir)
        before_write()
    with run_lock(run_dir):
        return _fresh_run(trainer, spec, run_dir, setup, origin)


def _fresh_run(
    trainer: DQNTrainer,
    spec: RunSpec,
    run_dir: Path,
    setup: TradingSetup | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    from foxhunt.logging import MetricLogger

    hp = spec.hyperparameters
    atomic_write_text(run_dir / "config.yaml", spec.to_yaml())
    write_data_record(run_dir, setup)  # what evaluate and resume check the data against
    trainer.logger = MetricLogger(run_dir)
    trainer._checkpointer = TrainerCheckpointer(run_dir, spec)
    log.info(
        "training %s for %d env steps; effective batch size %d",
        spec.env or "trading",
        spec.total_env_steps,
        hp.effective_batch_size,
    )
    say(
        f"foxhunt: run {run_dir} | "
        + (f"{origin} | " if origin else "")
        + f"effective batch size {hp.effective_batch_size} "
        f"({hp.batch_size} x {hp.gradient_accumulation_steps})"
    )
    return _train_loop(trainer, spec, run_dir, spec.total_env_steps)


def resume_training(
    run_dir: Path, *, total_steps: int | None = None, progress: bool = True
) -> dict[str, Any]:
    """Continue ``run_dir`` from its latest checkpoint, exactly as if it had never stopped."""
    if total_steps is not None:  # 0 read as "not given"; 300.5 failed in the checkpointer
        integral = isinstance(total_steps, numbers.Integral) and not isinstance(total_steps, bool)
        if not integral or total_steps <= 0:
            raise ConfigError(f"total_steps must be a positive integer, got: {total_steps!r}")
        total_steps = int(total_steps)
    spec = load_spec(run_dir)
    with run_lock(run_dir):
        return _resume(run_dir, spec, total_steps, progress)


def _latest_checkpoint(
    run_dir: Path, spec: RunSpec, purpose: str = "to resume from"
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """The newest checkpoint that verifies: tensors, state and its path."""
    from foxhunt.checkpoint import CheckpointManager, CheckpointWarning
    from foxhunt.errors import CheckpointError

    manager = CheckpointManager(run_dir, keep_last=spec.hyperparameters.keep_checkpoints)
    # The manager reports skipped (corrupted) checkpoints as warnings; turn them into one log line,
    # or into the error itself when no checkpoint verifies, so the user sees why in one line.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        try:
            tensors, state, path = manager.load_latest()
        except CheckpointError:
            reasons = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
            if reasons:
                raise CheckpointError(reasons[-1]) from None
            raise CheckpointError(
                f"no checkpoint {purpose} in {manager.checkpoints_dir}{halted_hint(run_dir)}"
            ) from None
    for w in caught:
        log.warning("%s", w.message)
    return tensors, state, path


def checkpoint_agent(run_dir: str | Path) -> DQNAgent:
    """The agent of a run's latest checkpoint (``load_model(run, "latest")``): the policy of a
    run stopped part way (Ctrl-C, a crash, a halt) or still training, where no model is written
    yet. The run's environment is rebuilt to restore it, as a resume would."""
    run_dir = Path(run_dir)
    spec = load_spec(run_dir)
    tensors, state, path = _latest_checkpoint(run_dir, spec, "to load")
    _check_same_environment(run_dir, spec, state)
    # Only the weights are wanted: the run's file grown by new bars (acting on them) is fine.
    trainer, _ = _build_trainer(spec, run_dir, progress=False, resuming=True, purpose="evaluate")
    try:
        restore_state(trainer, tensors, state)
    finally:
        trainer.close()
    log.info("%s: the weights of checkpoint %s", run_dir, path.name)
    return trainer.agent


def _resume(
    run_dir: Path, spec: RunSpec, total_steps: int | None, progress: bool
) -> dict[str, Any]:
    from foxhunt.logging import MetricLogger

    tensors, state, path = _latest_checkpoint(run_dir, spec)
    _check_same_environment(run_dir, spec, state)
    ranks = (state.get("run") or {}).get("world_size", 1)
    if isinstance(ranks, int) and ranks > 1:
        log.warning(
            "%s trained data-parallel on %d processes and continues in one: each optimizer step "
            "now averages 1/%d of the samples it did, and env steps are collected once",
            run_dir,
            ranks,
            ranks,
        )
    trainer, _ = _build_trainer(spec, run_dir, progress=progress, resuming=True)
    try:
        restore_state(trainer, tensors, state)
        total = total_steps or trainer.total_env_steps or spec.total_env_steps
        if total_steps is None and spec.total_env_steps > total:
            # `resume --total-steps N` wrote N into config.yaml and stopped before its first
            # checkpoint: the extension asked for is still the one to finish (whether or not
            # the checkpoint had reached its own, shorter total).
            total = spec.total_env_steps
            log.warning(
                "%s: continuing to config.yaml's %d env steps (an extension stopped before its "
                "first checkpoint)",
                run_dir,
                total,
            )
        if total_steps is None and trainer.env_steps >= total and not _finished(run_dir, trainer):
            # Stopped after the final checkpoint, before the model was written (a crash or a
            # stop signal during the final save): the checkpoint holds the finished run.
            log.warning(
                "%s: training reached its %d env steps but stopped before writing its model; "
                "writing it from %s",
                run_dir,
                trainer.env_steps,
                path.name,
            )
            trainer.close()
            summary = trainer.summary()
            _finish(trainer, run_dir, summary, spec)
            return summary
        if total <= trainer.env_steps:
            if total_steps is None:
                raise FoxhuntError(
                    f"run {run_dir} is complete at {trainer.env_steps} env steps: pass "
                    f"--total-steps above {trainer.env_steps} to continue it"
                )
            raise FoxhuntError(
                f"--total-steps must exceed the checkpoint's {trainer.env_steps} env "
                f"steps, got: {total}"
            )
        # Something at a name the resumed run will save a checkpoint under (a later checkpoint
        # skipped for a file it holds) would stop the run there, after training: say so now,
        # with every file as it was.
        from foxhunt.checkpoint import CheckpointManager
        from foxhunt.errors import CheckpointError

        blocked = CheckpointManager(run_dir).blocked(trainer.planned_checkpoints(total))
        if blocked:
            where, extra = blocked[0]
            what = f"holds {', '.join(map(repr, extra[:3]))}" if extra else "is a file or a link"
            raise CheckpointError(
                f"{where} {what}, which no checkpoint writes: the resume from {path.name} would "
                "have to replace it; move that out of the way and resume again"
            )
        # The logger checks (and trims) metrics.csv before config.yaml is rewritten, so a bad
        # metrics file stops the resume with every file as it was.
        trainer.logger = MetricLogger(
            run_dir, resume=True, truncate_after_env_steps=trainer.env_steps
        )
        _warn_lost_metrics(trainer, trainer.logger)
        if total != spec.total_env_steps:
            spec = spec.model_copy(update={"total_env_steps": total})
            atomic_write_text(run_dir / "config.yaml", spec.to_yaml())
        trainer._checkpointer = TrainerCheckpointer(run_dir, spec)
        if progress:
            say(f"foxhunt: resuming {run_dir} from {path.name} at env step {trainer.env_steps}")
        _warn_schedule_change(trainer, total)
    except BaseException:
        trainer.close()  # async env workers too: nothing is left running on an error
        raise
    return _train_loop(trainer, spec, run_dir, total)


def _warn_lost_metrics(trainer: DQNTrainer, logger: MetricLogger) -> None:
    """Say when metrics.csv lacks rows the run logged before its checkpoint (the file was cut
    short or removed): the resumed run logs from the checkpoint on and cannot write them again."""
    due = trainer._next_log - trainer.hp.log_interval  # the last row logged before the checkpoint
    if due < trainer.hp.log_interval:
        return  # no row was due yet
    last = logger.resumed_env_steps or 0.0  # as the logger read the file when it resumed
    if last < due:
        log.warning(
            "%s ends at env step %d, but the run logged up to env step %d before its checkpoint: "
            "the rows in between are lost (the file was cut short or replaced)",
            logger.csv_path,
            last,
            due,
        )


def _warn_schedule_change(trainer: DQNTrainer, total: int) -> None:
    """Epsilon and PER beta anneal over a fraction of the total steps: a new total moves them
    from where they are now. Exact continuation keeps the total; say so when it does not."""
    before = (trainer.epsilon, trainer.beta)
    own = trainer.total_env_steps
    trainer.total_env_steps = total
    after = (trainer.epsilon, trainer.beta)
    trainer.total_env_steps = own
    hp = trainer.hp
    if hp.decays_over_run:
        ends = [planned_updates(0, t, hp) for t in (own, total)]
        if ends[0] != ends[1]:
            agent = trainer.agent
            rates = [agent.planned_rate(end) for end in ends]
            log.warning(
                "the learning rate's %s decay follows the new total of %d env steps (was %d): "
                "it ends at optimizer step %d (was %d; %d taken), and the next step's rate "
                "goes from %.4g to %.4g",
                hp.lr_schedule,
                total,
                own,
                ends[1],
                ends[0],
                agent.optimizer_steps,
                rates[0],
                rates[1],
            )
    for name, old, new in zip(("epsilon", "PER beta"), before, after, strict=True):
        if name == "PER beta" and not trainer.hp.prioritized_replay:
            continue
        if abs(old - new) > 1e-9:
            log.warning(
                "%s follows the new total of %d env steps (was %d): at env step %d it goes from "
                "%.4g to %.4g",
                name,
                total,
                own,
                trainer.env_steps,
                old,
                new,
            )


def train_run(
    spec: RunSpec, run_dir: str | Path, *, progress: bool = True, verbose: bool = True
) -> dict[str, Any]:
    """Train ``spec`` (from :func:`foxhunt.runs.build_spec`) into a new or empty ``run_dir``,
    writing what ``foxhunt train`` writes, so ``foxhunt evaluate/resume/report`` and
    :func:`evaluate_run` work on it: the trading pipeline (market, regimes, splits, costs)
    from Python. ``progress``: the live display; ``verbose``: the run line and the summary
    table (warnings are logged either way). Returns the training summary."""
    require_spec(spec)
    run_dir = Path(run_dir)
    require_new_dir(run_dir, "run_dir")
    with caller_state(verbose):
        return run_training(spec, run_dir, progress=progress)


def resume_run(
    run_dir: str | Path,
    *,
    total_steps: int | None = None,
    progress: bool = True,
    verbose: bool = True,
) -> dict[str, Any]:
    """Continue a run from its latest checkpoint (``foxhunt resume`` from Python)."""
    refuse_other_dir(
        Path(run_dir), "foxhunt.resume_ensemble(run_dir) finishes one stopped part way"
    )
    with caller_state(verbose):
        return resume_training(Path(run_dir), total_steps=total_steps, progress=progress)


def walk_forward_runs(
    spec: RunSpec,
    run_root: str | Path,
    *,
    n_folds: int,
    train_size: int,
    validation_size: int,
    test_size: int,
    step: int | None = None,
    window: str = "rolling",
    progress: bool = False,
    verbose: bool = False,
) -> pd.DataFrame:
    """Walk-forward evaluation of ``spec`` on its market: one full run per fold, each trained
    on its own past only and backtested on the next ``test_size`` bars.

    Folds come from :func:`foxhunt.markets.data.walk_forward` (anchored to the last bar; test
    windows ``step`` bars apart, back to back by default). A fold's ``train_size`` bars end with
    its ``validation_size`` validation bars (model selection, early evaluations); its regime
    detector and normalisation are fitted on the rest, so nothing from its test window or later
    reaches it. Each fold is an ordinary run in ``run_root/fold-K/run`` (its bars in
    ``run_root/fold-K/bars.csv``; the ``run_dir`` column of the result says where), so
    ``foxhunt evaluate/report`` work on it. Every input is checked before anything
    is written. Returns one row per fold, also written to ``run_root/walk_forward.csv``.
    """
    from pydantic import ValidationError

    from foxhunt.config import _format_validation_error
    from foxhunt.markets.data import walk_forward
    from foxhunt.runs import MarketSpec, build_trading, load_market_frame

    require_spec(spec)
    if not spec.is_trading:
        raise ConfigError(f"walk_forward_runs is for trading runs; got env {spec.env!r}")
    run_root = Path(run_root)
    require_new_dir(run_root, "run_root")
    frame = load_market_frame(spec)
    # walk_forward checks n_folds, the sizes, step and window (nothing is written yet).
    folds = walk_forward(
        frame,
        n_folds,
        train_size,
        test_size,
        step,
        window=window,  # type: ignore[arg-type]
    )
    bad = isinstance(validation_size, bool) or not isinstance(validation_size, int)
    if bad or not 0 < validation_size < train_size:
        raise ConfigError(
            f"validation_size must be between 1 and train_size - 1 ({train_size - 1}), "
            f"got {validation_size!r}"
        )
    names = frame.attrs.get("regime_names")
    plans = []
    for k, (train, test) in enumerate(folds):
        path = run_root / f"fold-{k}" / "bars.csv"
        # The bar after the test span closes its last period (the next fold trades from it);
        # without it each fold dropped one return, and a stitched curve one per fold.
        after = frame.iloc[frame.index.get_loc(test.index[-1]) + 1 :].iloc[:1]
        n = len(train) + len(test) + len(after)
        try:  # exact bounds under the runs' int(n * fraction) split (half a bar of slack)
            market = MarketSpec(
                **{
                    **spec.market.model_dump(),
                    "data": str(path.resolve()),
                    "train_fraction": (len(train) - validation_size + 0.5) / n,
                    "validation_fraction": (validation_size + 0.5) / n,
                }
            )
        except ValidationError as err:  # the fractions leave no test span (test_size too small)
            raise ConfigError(
                f"fold {k}: {_format_validation_error(err, prefix='market.')} (train_size="
                f"{train_size}, validation_size={validation_size}, test_size={test_size})"
            ) from None
        bars = pd.concat([train, test, after])
        if names and "regime" in bars and "regime_name" not in bars:
            bars = bars.assign(regime_name=[names[int(r)] for r in bars["regime"]])
        fold_spec = spec.model_copy(update={"market": market})
        try:  # what training the fold would refuse (span sizes, window, detector), refused now
            build_trading(fold_spec, frame=bars)
        except FoxhuntError as err:
            raise ConfigError(
                f"fold {k} of {len(bars)} bars (train_size={train_size}, validation_size="
                f"{validation_size}, test_size={test_size}, the bar after its test window if "
                f"any): {first_line(err)}"
            ) from None
        plans.append((path, bars, fold_spec, train, test))
    rows = []
    for k, (path, bars, fold_spec, train, test) in enumerate(plans):
        path.parent.mkdir(parents=True)
        atomic_write_text(path, bars.to_csv())
        run_dir = path.parent / "run"
        train_run(fold_spec, run_dir, progress=progress, verbose=verbose)
        result = evaluate_run(run_dir, split="test")
        agent, hold = result["metrics"]["agent"], result["metrics"]["buy & hold"]
        rows.append(
            {
                "fold": k,
                "train_start": str(train.index[0]),
                "test_start": str(test.index[0]),
                "test_end": str(test.index[-1]),
                "test_bars": result["bars"],
                "agent_total_log_return": agent["total_log_return"],
                "agent_sharpe": agent["sharpe"],
                "buy_and_hold_total_log_return": hold["total_log_return"],
                "buy_and_hold_sharpe": hold["sharpe"],
                "oracle_capture": result["oracle_capture"],
                "run_dir": str(run_dir),
            }
        )
    table = pd.DataFrame(rows)
    atomic_write_text(run_root / "walk_forward.csv", table.to_csv(index=False))
    return table


def require_new_dir(path: Path, name: str) -> None:
    """Refuse a directory that already holds files: a run never writes over another's."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"{name} must be a new or empty directory, got: {path}")


@contextlib.contextmanager
def caller_rng_state() -> Iterator[None]:
    """The caller's global RNGs (Python's ``random``, NumPy's global one, torch's CPU generator
    and any CUDA one already in use) as they were before the block. A trainer seeds them with
    the run's seed, as Stable-Baselines3 does; left so, a script that draws its next random
    configuration from ``np.random`` after each run drew the same one every time."""
    import random

    import torch

    python_state, numpy_state = random.getstate(), np.random.get_state()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


@contextlib.contextmanager
def caller_state(verbose: bool) -> Iterator[None]:
    """A run from Python prints none of its messages unless ``verbose`` (the progress display,
    when asked for, still shows; what other threads print is theirs), and leaves the caller's
    global RNGs as they were. (The caller's torch thread count is kept by the trainer, which
    sets ``torch_threads`` only inside learn and evaluate.)"""
    from foxhunt.logging import quiet

    with caller_rng_state(), quiet(not verbose):
        yield


def next_position(
    run_dir: str | Path,
    data: str | Path | None = None,
    *,
    model: str = "final",
    held: float | None = None,
    risk_aversion: float = 0.0,
    max_std: float | None = None,
    fallback_action: int | None = None,
) -> dict[str, Any]:
    """The position a trading run's policy takes at the last bar of its data, to hold over the
    next period: acting on new bars. ``data`` is the run's data grown by the new bars (the
    whole history: filtered regime probabilities and features are computed from the start),
    or None for the run's own file as it is now. The run's spans, normalisation and regime
    detector stay as trained.

    The observation includes the position held into the last bar. By default that is the
    policy's own, replayed from the start of the test span; ``held`` (one of the run's
    positions) gives the one actually held instead. Returns the bar's timestamp (UTC where the
    file's times carry a zone, bars at local midnight keeping their dates, as the loader reads
    them), the number of bars after those the run
    trained on (0, warned about: no new bar), the action and its position (held from this bar's
    close to the next bar's), the position held into the bar, and the bar's regime
    probabilities.

    An ensemble directory acts as ``ensemble evaluate`` does (its members' final weights,
    ``risk_aversion``, ``max_std`` with ``fallback_action``, by default the flat position) and
    adds the decision's uncertainty under ``"ensemble"``."""
    from foxhunt.envs.trading import TradingEnv
    from foxhunt.runs import build_trading, data_path

    run_dir = Path(run_dir)
    is_ensemble, spec, held = _next_position_options(
        run_dir, model, held, risk_aversion, max_std, fallback_action
    )
    positions = spec.trading_config().positions
    recorded = read_data_record(run_dir)
    path = data_path(data, "data")
    if path is not None and recorded is None:  # a run from before data.json: nothing to match
        raise ConfigError(
            f"data {path} does not start with the bars the run trained on (it has no data.json "
            "record to match): pass the run's data grown by the new bars (the whole history)"
        )
    recorder = None
    if is_ensemble:  # its options checked before the data is read
        from foxhunt.ensemble import QEnsemble, _Recorder, flat_action

        ensemble = QEnsemble.load(run_dir)
        if fallback_action is None:
            fallback_action = flat_action(positions, max_std)
        recorder = _Recorder(ensemble, risk_aversion, fallback_action, max_std)
    # Read once: the market build checks the file continues the run's data (else refuses it).
    setup = build_trading(spec, data_override=path, recorded=recorded, continuing=True)
    span = setup.span("test")
    if recorder is not None:
        act: Callable[[Any], int] = recorder
        fits = _model_fits(recorder.ensemble.agents[0], run_dir / recorder.ensemble.names[0])
    else:
        agent = load_model(run_dir, model)  # warns when there is no best to load
        act, fits = model_policy(agent), _model_fits(agent, run_dir)
        model = _weights_used(run_dir, model)
    env = TradingEnv(span, setup.config, eval_mode=True)
    fits(env, "the trading env")
    obs, replayed = _position_into_last_bar(env, act, held, run_dir)
    action = act(obs)
    timestamps = span.timestamps
    # Bars after those the run trained on: 0 is the last trained bar's decision again, which a
    # daily job whose feed failed to append would otherwise take for today's.
    new_bars = None if recorded is None else len(setup.market) - int(recorded["rows"])
    if new_bars == 0:
        log.warning(
            "%s holds no bars after those the run trained on: this is the decision at its last "
            "trained bar (%s)",
            path or "the run's data",
            pd.Timestamp(timestamps[-1]) if timestamps is not None else "?",
        )
    out = {
        "timestamp": str(pd.Timestamp(timestamps[-1])) if timestamps is not None else None,
        "new_bars": new_bars,
        "action": action,
        "position": float(positions[action]),
        "held": replayed,
        "regime_probabilities": [float(p) for p in span.regime_probs[-1]],
        "model": model,
    }
    if recorder is not None:  # the last decision's uncertainty, as ensemble evaluate reports it
        out["ensemble"] = {
            "members": list(recorder.ensemble.names),
            "risk_aversion": float(risk_aversion),  # NumPy scalars are accepted: plain here
            "max_std": None if max_std is None else float(max_std),
            "fallback_action": None if fallback_action is None else int(fallback_action),
            "chosen_std": recorder.chosen_std[-1],
            "mean_std": recorder.mean_std[-1],
            "disagreement": recorder.disagreement[-1],
            "fell_back": recorder.fell_back[-1],
        }
    return out


def _next_position_options(
    run_dir: Path,
    model: str,
    held: float | None,
    risk_aversion: float,
    max_std: float | None,
    fallback_action: int | None,
) -> tuple[bool, RunSpec, float | None]:
    """next_position's options checked against the run before any data is read: (whether it is
    an ensemble, its spec, ``held`` as the run's own position value)."""
    is_ensemble = (run_dir / "ensemble.json").is_file()
    if is_ensemble and model != "final":
        raise ConfigError(
            f"model applies to one run; the ensemble {run_dir} acts on its members' final "
            f"weights, got model={model!r}"
        )
    no_risk = isinstance(risk_aversion, numbers.Real) and not isinstance(risk_aversion, bool)
    given = {
        k: v
        for k, v, unset in (
            ("risk_aversion", risk_aversion, no_risk and risk_aversion == 0),
            ("max_std", max_std, max_std is None),
            ("fallback_action", fallback_action, fallback_action is None),
        )
        if not unset
    }
    if given and not is_ensemble:
        raise ConfigError(
            f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} to ensembles; "
            f"{run_dir} is one run, got " + ", ".join(f"{k}={v!r}" for k, v in given.items())
        )
    if is_ensemble:
        from foxhunt.ensemble import require_limit_for_fallback

        require_limit_for_fallback(fallback_action, max_std)
    spec = load_spec(run_dir)
    if not spec.is_trading:
        raise ConfigError(f"{run_dir} trained on {spec.env!r}: next_position is for trading runs")
    positions = spec.trading_config().positions
    number = isinstance(held, numbers.Real) and not isinstance(held, bool)
    if held is not None and (not number or held not in positions):  # True == 1.0; 1+0j too
        raise ConfigError(
            f"held must be one of the run's positions {list(positions)}, got {held!r}"
        )
    if held is not None:  # the run's own value (-0.0 is flat, 0.0)
        held = float(positions[list(positions).index(held)])
    return is_ensemble, spec, held


def _position_into_last_bar(
    env: Any, act: Callable[[Any], int], held: float | None, run_dir: Path
) -> tuple[Any, float]:
    """The last bar's observation and the position held into it: ``held`` as given, or the
    policy's own, replayed from the start of the span."""
    positions = env.config.positions
    obs, info = env.reset()
    if held is not None:
        # Features and regimes do not depend on the positions taken: the last bar's
        # observation with the position actually held, without a replay.
        state = env.get_state()
        state.update(t=env.last_bar, position_index=list(positions).index(held))
        env.set_state(state)
        obs, replayed = env.observation(), float(held)
    else:  # the policy's own position, replayed from the start of the test span
        from foxhunt.backtest import batched_greedy

        done, replay = False, batched_greedy(env, act)  # the backtest's actions, faster
        while not done:
            obs, _, terminated, truncated, info = env.step(replay(obs))
            done = terminated or truncated
        if info.get("bankrupt"):
            raise FoxhuntError(
                f"{run_dir}: the policy's replayed equity was wiped out at "
                f"{pd.Timestamp(info['timestamp'])}, before the last bar: pass held= (the "
                "position actually held) to decide from it"
            )
        replayed = float(info["position"])
    return obs, replayed


def _weights_used(run_dir: Path, model: str) -> str:
    """The weights ``load_model`` loads: the final ones when a run kept no best (it warns)."""
    if model == "best" and not (run_dir / "best_model.safetensors").is_file():
        return "final"
    return model


def evaluate_run(
    run_dir: str | Path,
    *,
    data: str | Path | None = None,
    split: str | None = None,
    episodes: int | None = None,
    model: str = "final",
) -> dict[str, Any]:
    """Backtest a trading run (report in ``run_dir/backtest``, or ``backtest_<model>_<split>``
    for another model or split) or score a Gymnasium run.

    ``model`` picks the final weights (``"final"``), the best-evaluated ones (``"best"``: model
    selection on the validation span) or the newest checkpoint's (``"latest"``: a run still
    training or stopped part way). ``data`` and ``split`` (default test) apply to trading runs
    only, ``episodes`` (default 10) to Gymnasium runs only: a run refuses what does not apply
    rather than ignore it.
    """
    run_dir = Path(run_dir)
    refuse_other_dir(run_dir, "foxhunt.evaluate_ensemble(run_dir) evaluates it")
    spec = load_spec(run_dir)
    episodes = check_evaluation_options(spec, run_dir, data=data, split=split, episodes=episodes)
    data = data_path(data)
    agent = load_model(run_dir, model)
    requested, model = model, _weights_used(run_dir, model)
    # A run without best weights: the final ones stand in, and the result says so.
    stood_in = {} if requested == model else {"model_requested": requested}
    act = model_policy(agent)
    fits = _model_fits(agent, run_dir)
    if not spec.is_trading:
        out = {**stood_in, "model": model, **gym_evaluation(spec, act, episodes, fits=fits)}
        # Named after what was asked for, as documented: the best weights' score (or the final
        # weights standing in for them) beside the final one's, never over it.
        name = "evaluation.json" if requested == "final" else f"evaluation_{requested}.json"
        atomic_write_text(run_dir / name, json.dumps(out, indent=2))
        return out
    return stood_in | backtest_run(
        run_dir,
        spec,
        act,
        data=data,
        split="test" if split is None else split,
        model=model,
        fits=fits,
        requested=requested,
    )


def _model_fits(agent: DQNAgent, run_dir: Path) -> Callable[[Any, str], None]:
    """A check that the run's env, as config.yaml builds it, is the one the model was trained
    on: a config.yaml edited (or emptied) after training otherwise failed deep in the network
    with a shape error, or acted on the wrong actions."""

    recorded = _trained_positions(run_dir)

    def check(env: Any, what: str) -> None:
        positions = getattr(getattr(env, "config", None), "positions", None)
        if recorded is not None and positions is not None and recorded != tuple(positions):
            raise ConfigError(
                f"{run_dir}: the model (model.json) chooses among the positions "
                f"{list(recorded)}, but config.yaml's trading.positions are {list(positions)}: "
                f"was config.yaml changed after training?"
            )
        shape = tuple(int(d) for d in env.observation_space.shape)
        n = int(getattr(env.action_space, "n", -1))
        if shape != agent.obs_shape or n != agent.n_actions:
            raise ConfigError(
                f"{run_dir}: the model (model.json) takes observations of shape "
                f"{agent.obs_shape} and chooses among {agent.n_actions} actions, but the env "
                f"config.yaml describes ({what}) gives observations of shape {shape} and "
                f"{n} actions: was config.yaml changed after training?"
            )

    return check


def _trained_positions(run_dir: Path) -> tuple[float, ...] | None:
    """The positions model.json says the model was trained to choose among; None for a
    Gymnasium run, or a model saved before they were recorded."""
    path = run_dir / "model.json"
    try:
        raw = json.loads(path.read_text()).get("trading_positions")
    except (OSError, ValueError, AttributeError):
        return None  # the model's own loader has already said what is wrong with the file
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or not raw
        or not all(type(v) in (int, float) and math.isfinite(v) for v in raw)
    ):
        raise FoxhuntError(
            f"{path}: trading_positions must be a non-empty list of numbers, got: {raw!r:.80}"
        )
    return tuple(float(v) for v in raw)


def check_evaluation_options(
    spec: RunSpec,
    run_dir: Path,
    *,
    data: str | Path | None,
    split: str | None,
    episodes: int | None,
) -> int:
    """Refuse evaluation options that do not apply to this run; the episode count to use."""
    if spec.is_trading:
        given, applies, kind = {"--episodes": episodes}, "Gymnasium runs", "is a trading run"
    else:
        given = {"--data": data, "--split": split}
        applies, kind = "trading runs", f"trained on {spec.env!r}"
    for name, value in given.items():
        if value is not None:
            written = str(value) if isinstance(value, Path) else value  # as the user wrote it
            raise ConfigError(f"{name} applies to {applies}; {run_dir} {kind}, got: {written!r}")
    if spec.is_trading and split is not None:  # before any loading
        check_split(split)
    if episodes is None:
        return 10
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"episodes must be a positive integer, got: {episodes!r}")
    if episodes > 1_000_000:  # the seed list alone would exhaust memory long before the end
        raise ConfigError(f"episodes must be at most 1,000,000, got: {episodes:,}")
    return episodes


def gym_evaluation(
    spec: RunSpec, act: Any, episodes: int, *, fits: Callable[[Any, str], None] | None = None
) -> dict[str, Any]:
    """Greedy returns of ``act`` on the run's Gymnasium env, on seeds shared by every evaluator.
    ``fits`` checks the env against the model first."""
    from foxhunt.envs.gym_envs import make_gym_env

    env = make_gym_env(spec.env, kwargs=spec.env_kwargs)  # type: ignore[arg-type]
    seeds = [spec.hyperparameters.seed + 2_000_003 + k for k in range(episodes)]
    try:
        if fits is not None:
            fits(env, repr(spec.env))
        limit, counts = evaluation_step_limit(env), {"cut": 0}
        returns = episode_returns(env, act, seeds, limit, counts=counts)
    finally:
        env.close()
    return {
        "env": spec.env,
        **({"env_kwargs": spec.env_kwargs} if spec.env_kwargs else {}),
        "episodes": episodes,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "first_seed": seeds[0],
        **(
            {"episode_step_limit": limit, "cut_episodes": counts["cut"]}
            if limit < NO_STEP_LIMIT
            else {}
        ),
        **({"returns": [float(r) for r in returns]} if episodes <= 1000 else {}),
    }


def _warn_in_sample(
    span: Any, window: int, recorded: dict[str, Any], data: str, run_dir: Path
) -> None:
    """Say so when a backtest of another file trades bars at times the run trained or
    validated on: a file cut short, or a window that ends before the training span did, is
    split anew, and its test span can lie inside the run's own training data."""
    last = recorded.get("validated_last")
    if last is None:  # a record from before it was kept
        return
    times = pd.DatetimeIndex(span.timestamps)[window - 1 :]  # traded: after the warm-up bars
    seen = (times >= pd.Timestamp(recorded["first"])) & (times <= pd.Timestamp(last))
    if seen.any():
        log.warning(
            "%s: %d of the %d bars this backtest trades (%s .. %s) lie within the bars %s "
            "trained or validated on (%s .. %s): on the same market the result is in-sample",
            data,
            int(seen.sum()),
            len(times),
            times[0],
            times[-1],
            run_dir,
            recorded["first"],
            last,
        )


def _warn_other_frequency(
    ppy: float, bar: float | None, recorded: dict[str, Any], data: str, run_dir: Path
) -> None:
    """Say so when a backtest's bars come at another pace than the bars the run trained on
    (minute bars for a daily model): its features and regimes then mean something else. Bars
    of the same length traded on other hours (hourly stock bars against 24/7 crypto) are not."""

    def number(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, int | float) and value > 0

    trained, trained_bar = recorded.get("periods_per_year"), recorded.get("bar_seconds")
    if not number(trained):
        return  # a record from before it was kept
    if number(trained_bar) and bar is not None and 0.5 <= bar / trained_bar <= 2.0:
        return
    if not 0.5 <= ppy / trained <= 2.0:
        log.warning(
            "%s: its bars come about %s a year, those %s trained on about %s a year: a model "
            "trained on one bar frequency is backtested on another",
            data,
            f"{ppy:,.0f}",
            run_dir,
            f"{trained:,.0f}",
        )


def backtest_dir_name(model: str = "final", split: str = "test") -> str:
    """The folder of a trading run's backtest: ``backtest`` for the final model on the test
    span, with the model and the split appended where they differ (``backtest_best_validation``)."""
    return "_".join(
        ["backtest"] + ([model] if model != "final" else []) + ([split] if split != "test" else [])
    )


def backtest_run(
    run_dir: Path,
    spec: RunSpec,
    act: Any,
    *,
    data: str | None,
    split: str,
    setup: TradingSetup | None = None,
    model: str = "final",
    fits: Callable[[Any, str], None] | None = None,
    requested: str | None = None,
) -> dict[str, Any]:
    """Agent vs buy-and-hold, flat, the regime rule and (when true regimes are known) the
    regime oracle. ``fits`` checks the trading env against the model first.

    ``setup`` is the run's market when the caller already built it (an ensemble backtests its
    members on the same one), so the detector is not fitted twice. ``model`` names the weights
    in the report. The report goes to ``backtest/`` for the final model on the test span, and
    beside it for another model or split (``backtest_best/``, ``backtest_validation/``,
    ``backtest_latest_all/``), named after the ``requested`` model (the final weights standing
    in for missing best ones go to ``backtest_best/``), as a Gymnasium run's
    ``evaluation_best.json`` is: comparing two of them keeps both. Another ``--data`` replaces
    the same model and split's report.
    """
    from foxhunt import backtest as bt
    from foxhunt.runs import build_trading

    recorded = read_data_record(run_dir)
    if setup is None:
        setup = build_trading(spec, data_override=data, recorded=recorded)
    span = setup.span(split, closing=True)
    if data is not None and recorded is not None:
        _warn_in_sample(span, setup.config.window, recorded, data, run_dir)
    config = setup.config
    if fits is not None:
        from foxhunt.envs.trading import TradingEnv

        fits(TradingEnv(span, config, eval_mode=True), "the trading env")
    # The bar frequency is the file's, read once from all of it: a span's own timestamps would
    # give each split its own rate (a test span inside one session, a weekend, a data gap).
    ppy, caveat = bt.periods_per_year_with_caveat(setup.market.timestamps)
    if caveat is not None:
        log.warning("%s: %s", data or spec.market.data or "the market", caveat)
    if data is not None and recorded is not None:
        bar = bt.median_bar_seconds(setup.market.timestamps)
        _warn_other_frequency(ppy, bar, recorded, data, run_dir)
    agent_res = bt.run_policy(span, act, config, "agent", periods_per_year=ppy)
    results = [
        agent_res,
        bt.buy_and_hold(span, config, periods_per_year=ppy),
        bt.flat(span, config, periods_per_year=ppy),
    ]
    if span.regime_probs.shape[1] > 1:  # what the detector alone earns (not for detector none)
        results.append(bt.regime_rule(span, config, setup.span("train"), periods_per_year=ppy))
    capture = accuracy = None
    if span.true_regimes is not None:
        from foxhunt.markets.regimes import regime_accuracy

        oracle = bt.regime_oracle(span, config, setup.span("train"), periods_per_year=ppy)
        results.append(oracle)
        capture = bt.oracle_capture(agent_res, oracle)
        # Over the bars the periods end on (from the split's second bar to its last, or to
        # the next split's first: never the window's warm-up bars borrowed from the split
        # before): the bars the per-regime tables label.
        accuracy = regime_accuracy(agent_res.detected_regimes, agent_res.true_regimes)
    out_dir = run_dir / backtest_dir_name(requested or model, split)
    model_note = "" if model == "final" else f", {model} model"
    if requested is not None and requested != model:  # filed under the model asked for
        model_note = f", final weights standing in for the {requested} model (none was kept)"
    files = bt.write_report(
        out_dir,
        results,
        title=f"foxhunt backtest: {split} span{model_note}",
        regime_accuracy=accuracy,
        rate_caveat=caveat,
    )
    summary = {
        "model": model,
        "split": split,
        "data": data or spec.market.data or "synthetic",
        # The periods traded: one per own bar, the last one closing on the next split's first
        # bar (none after the data's last bar). The window's warm-up bars are not counted.
        "bars": len(agent_res.net_log_returns),
        "periods_per_year": ppy,
        "metrics": {r.name: r.metrics for r in results},
        "oracle_capture": capture,
        **(
            {"oracle_capture_note": "undefined: the regime oracle earned nothing on this span"}
            if capture is not None and not math.isfinite(capture)
            else {}
        ),
        "regime_accuracy": accuracy,
        "report": str(files.get("html", out_dir)),
        # Per-period positions, costs and equity of every strategy (pandas.read_csv(...,
        # index_col=0, parse_dates=True)), and the per-regime tables.
        "series": str(files["series"]),
        "metrics_file": str(files["json"]),
    }
    return summary
