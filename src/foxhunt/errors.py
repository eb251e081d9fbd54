"""Error types for user-facing failures.

Every error a user can cause (bad config, bad data file, bad checkpoint, bad CLI argument) is a
:class:`FoxhuntError`. The CLI turns these into one readable line and exit code 2, so messages
must name the field or file and the offending value.
"""

from __future__ import annotations


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


def first_line(exc: BaseException) -> str:
    """An exception's first line (its type's name when it has no message), for one-line
    warnings and errors that wrap it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
