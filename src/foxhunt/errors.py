"""Error types for user-facing failures.

Every error a user can cause (bad config, bad data file, bad checkpoint, bad CLI argument) is a
:class:`FoxhuntError`. The CLI turns these into one readable line and exit code 2, so messages
must name the field or file and the offending value.
"""

from __future__ import annotations

import signal
from pathlib import Path


class FoxhuntError(Exception):
    """Base class for errors caused by user input (never by a bug in foxhunt)."""


class ConfigError(FoxhuntError, ValueError):
    """An invalid hyperparameter or configuration value."""


class DataError(FoxhuntError, ValueError):
    """An invalid market-data file or frame; the message names the file, column and row."""


class CheckpointError(FoxhuntError):
    """A checkpoint that is missing, corrupted, tampered with or incompatible."""


class EnvironmentStepError(FoxhuntError):
    """The environment produced a non-finite observation or reward."""


class TrainingHalted(FoxhuntError):
    """A health monitor with the ``stop`` policy ended training; the message says why."""


def stop_signals() -> tuple[int, ...]:
    """The signals that stop training at a loop boundary with a checkpoint: Ctrl-C, SIGTERM
    (kill, docker stop, Slurm, systemd) and SIGHUP (the terminal or SSH session closed), the last
    where the platform has it and nothing ignores it (``nohup`` does: the run goes on)."""
    stops = [signal.SIGINT, signal.SIGTERM]
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
        stops.append(hangup)
    return tuple(stops)


def how_stopped(signum: int) -> str:
    """How a stop signal is named in messages: "interrupted (Ctrl-C)", "terminated (SIGTERM)"."""
    if signum == signal.SIGINT:
        return "interrupted (Ctrl-C)"
    if signum == getattr(signal, "SIGHUP", None):
        return "hung up (SIGHUP: the terminal closed)"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"terminated ({name})"


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) honoured at a loop boundary; says where training stopped, what was
    saved and which signal asked (``signum``). Here, not in the trainer, so the CLI's Ctrl-C
    handler can name it without importing torch (a Ctrl-C during that import left it
    half-loaded, and importing it again from the handler crashed)."""

    def __init__(
        self, env_steps: int, checkpoint: Path | None, signum: int = signal.SIGINT
    ) -> None:
        super().__init__(env_steps, checkpoint)
        self.env_steps = env_steps
        self.checkpoint = checkpoint
        self.signum = signum

    def __str__(self) -> str:  # a notebook's traceback line: not the args tuple "(1536, None)"
        saved = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint saved"
        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        return f"{name} at env step {self.env_steps}: {saved}"


def first_line(exc: BaseException) -> str:
    """An exception's first line (its type's name when it has no message), for one-line
    warnings and errors that wrap it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
