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
