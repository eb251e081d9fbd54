"""Metric sinks (CSV, TensorBoard) and the console progress display.

The CSV is the source of truth: fixed columns, repr-exact floats and a flush after every row, so a
crash leaves a readable file and two identical runs give byte-identical files. TensorBoard is an
optional mirror that silently degrades to a warning when it cannot be imported.

This module shadows the stdlib :mod:`logging` inside the package namespace; import the stdlib one
as ``import logging as _stdlib_logging`` if it is ever needed here, and in tests import names
(``from foxhunt.logging import MetricLogger``), never the module as ``logging``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging as _stdlib_logging
import math
import numbers
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from foxhunt._io import atomic_write_bytes
from foxhunt.errors import FoxhuntError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Task

log = _stdlib_logging.getLogger(__name__)

__all__ = [
    "METRIC_COLUMNS",
    "WALL_CLOCK_COLUMNS",
    "MetricLogger",
    "ProgressDisplay",
    "print_summary",
    "quiet",
    "say",
]

METRIC_COLUMNS: tuple[str, ...] = (
    "time_s",
    "env_steps",
    "optimizer_steps",
    "episodes",
    "episode_return",
    "episode_length",
    "loss",
    "grad_norm_pre_clip",
    "grad_norm_post_clip",
    "clipped",
    "clip_rate",
    "q_mean",
    "lr",
    "epsilon",
    "beta",
    "effective_batch_size",
    "env_steps_per_s",
    "updates_per_s",
    "skipped_steps",
    "eval_return",
)
"""The fixed columns of every metrics row, in file order."""

WALL_CLOCK_COLUMNS: tuple[str, ...] = ("time_s", "env_steps_per_s", "updates_per_s")
"""Columns that depend on wall-clock time: determinism checks must leave them out."""

MetricValue = float | int | None


def _format_cell(column: str, value: object) -> str:
    """Format one value so that it round-trips exactly (``repr`` of a float is shortest-exact)."""
    if value is None:
        return ""
    # bool first: it is an Integral, and numpy's bool is not, but both mean a 0/1 flag here.
    if isinstance(value, bool | np.bool_):
        return "1" if value else "0"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        # float() first: numpy 2 scalars repr as "np.float32(...)".
        return repr(float(value))
    raise TypeError(
        f"metric {column!r} must be a float, int, bool or None, got {type(value).__name__}"
        " (convert tensors with .item())"
    )


def _validate_columns(columns: Iterable[str]) -> tuple[str, ...]:
    cols = tuple(columns)
    if not cols:
        raise ValueError("columns must not be empty")
    if len(set(cols)) != len(cols):
        duplicates = sorted({c for c in cols if cols.count(c) > 1})
        raise ValueError(f"columns must be unique, duplicated: {duplicates}")
    for col in cols:
        if not col or any(ch in col for ch in ',"\r\n'):
            raise ValueError(f'column name {col!r} must be non-empty, without , " or newlines')
    return cols


class MetricLogger:
    """Append fixed-column metric rows to ``run_dir/csv_name`` and mirror them to TensorBoard.

    Rows are rejected (``ValueError``) when they carry a key outside ``columns`` so a typo in the
    trainer cannot silently drop a metric. With ``resume=True`` the existing file is kept and
    appended to; ``truncate_after_env_steps`` first drops rows logged after the checkpoint being
    resumed, so the final file equals the one of an uninterrupted run.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        columns: Iterable[str] = METRIC_COLUMNS,
        tensorboard: bool = True,
        csv_name: str = "metrics.csv",
        resume: bool = False,
        truncate_after_env_steps: int | None = None,
    ) -> None:
        self.columns: tuple[str, ...] = _validate_columns(columns)
        self._column_set = frozenset(self.columns)
        if truncate_after_env_steps is not None:
            if not resume:
                raise ValueError("truncate_after_env_steps requires resume=True")
            if "env_steps" not in self._column_set:
                raise ValueError("truncate_after_env_steps requires an 'env_steps' column")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / csv_name
        self._header = ",".join(self.columns) + "\n"
        """Rows appended by this logger (not counting rows kept from a resumed file)."""
        self.resumed_env_steps: float | None = None
        """The env steps of the last row kept from a resumed file (None: no row kept)."""

        if resume and self.csv_path.exists():
            self._prepare_resume(truncate_after_env_steps)
        else:
            atomic_write_bytes(self.csv_path, self._header.encode())
        # newline="" so "\n" is written as-is on every platform (byte-identical files).
        self._file = open(self.csv_path, "a", encoding="utf-8", newline="")  # noqa: SIM115

        self._writer: Any = None
        if tensorboard:
            self._writer = self._open_tensorboard(truncate_after_env_steps)

    # -- setup -------------------------------------------------------------------------------

    def _prepare_resume(self, truncate_after_env_steps: int | None) -> None:
        """Check the header, drop a torn last line and rows past the checkpoint, atomically."""
        try:
            text = self.csv_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise FoxhuntError(
                f"cannot resume {self.csv_path}: it is not UTF-8 text (byte {err.start}); "
                "restore the run's metrics file"
            ) from None
        if not text:
            atomic_write_bytes(self.csv_path, self._header.encode())
            return
        lines = text.split("\n")
        # A file ending in "\n" splits into [..., ""]; anything else there is a row cut short
        # by a crash mid-write, which the resumed run will log again.
        torn = lines.pop() != ""
        if not lines or lines[0] + "\n" != self._header:
            found = lines[0] if lines else text
            raise FoxhuntError(
                f"cannot resume {self.csv_path}: header {found!r} does not match the logger's "
                f"columns {','.join(self.columns)!r}"
            )
        rows = lines[1:]
        kept = rows
        if truncate_after_env_steps is not None:
            idx = self.columns.index("env_steps")
            kept = []
            for line_no, row in enumerate(rows, start=2):
                cells = row.split(",")
                if len(cells) != len(self.columns):
                    raise FoxhuntError(
                        f"cannot resume {self.csv_path}: line {line_no} has {len(cells)} cells, "
                        f"expected {len(self.columns)}"
                    )
                cell = cells[idx]
                try:
                    steps = float(cell) if cell else None
                except ValueError:
                    raise FoxhuntError(
                        f"cannot resume {self.csv_path}: line {line_no} env_steps={cell!r} is "
                        "not a number"
                    ) from None
                if steps is None or steps <= truncate_after_env_steps:
                    kept.append(row)
                    if steps is not None:
                        self.resumed_env_steps = steps
        if torn or len(kept) != len(rows):
            body = "".join(row + "\n" for row in kept)
            atomic_write_bytes(self.csv_path, (self._header + body).encode())

    def _open_tensorboard(self, truncate_after_env_steps: int | None) -> Any:
        """Open a SummaryWriter, or warn and return None when TensorBoard is unavailable."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as exc:  # ImportError, or a broken tensorboard/protobuf install
            warnings.warn(
                f"TensorBoard logging disabled (import failed: {exc}); metrics still go to "
                f"{self.csv_path}",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        # purge_step hides events a crashed run wrote after the checkpoint we resume from.
        purge = None if truncate_after_env_steps is None else truncate_after_env_steps + 1
        return SummaryWriter(
            log_dir=str(self.run_dir / "tensorboard"), purge_step=purge, flush_secs=10
        )

    # -- logging -----------------------------------------------------------------------------

    @property
    def tensorboard_enabled(self) -> bool:
        """Whether rows are mirrored to TensorBoard."""
        return self._writer is not None

    def log(self, row: Mapping[str, MetricValue]) -> None:
        """Append one row (missing or None -> empty cell) and flush it to the OS."""
        if self._file.closed:
            raise RuntimeError(f"MetricLogger for {self.csv_path} is closed")
        unknown = [key for key in row if key not in self._column_set]
        if unknown:
            raise ValueError(
                f"unknown metric column(s) {unknown} for {self.csv_path.name}; "
                f"known columns: {', '.join(self.columns)}"
            )
        cells = [_format_cell(col, row.get(col)) for col in self.columns]
        self._file.write(",".join(cells) + "\n")
        self._file.flush()

        if self._writer is not None:
            env_steps = row.get("env_steps")
            step = None if env_steps is None else int(env_steps)
            for col in self.columns:
                value = row.get(col)
                if value is None or col == "env_steps":
                    continue
                self._writer.add_scalar(col, float(value), global_step=step)

    def close(self) -> None:
        """Flush and close both sinks; safe to call twice."""
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- console ---------------------------------------------------------------------------------

_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("foxhunt_quiet", default=False)


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """foxhunt's own messages (the run line, the summary table) are not printed in this block.

    A context variable, not a swap of ``sys.stdout``: a quiet run from Python leaves what other
    threads and the caller's own code print alone, and the progress display it was asked for
    still shows."""
    token = _QUIET.set(on)
    try:
        yield
    finally:
        _QUIET.reset(token)


_STDOUT_LOST: list[str] = []  # why stdout was given up, once it was


def _lose_stdout(err: BaseException | None = None) -> None:
    """stdout's reader went away (a closed pipe: ``| head``, a dead ``tee``; a hung-up
    terminal): stop writing to it and go on. A run's results are its directory, not stdout, and
    the error (rich turns a broken pipe into ``SystemExit(1)``) ended training without a
    checkpoint. stdout's descriptor is pointed at /dev/null, so nothing written later (Python's
    own flush at exit included) can fail again."""
    if _STDOUT_LOST:
        return
    reason = (err.strerror or type(err).__name__) if isinstance(err, OSError) else ""
    _STDOUT_LOST.append(reason)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor: a notebook
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    why = f" ({_STDOUT_LOST[0]})" if _STDOUT_LOST[0] else ""
    log.warning(
        "stdout is closed%s: foxhunt prints nothing more there and carries on; the run "
        "directory keeps its metrics, checkpoints and results",
        why,
    )


def say(message: str) -> None:
    """Print one of foxhunt's messages to stdout, unless in a :func:`quiet` block.

    Flushed at once, so a reader gone away is met here (and survived), not at exit; a character
    stdout's encoding lacks (a run directory's name, on an ASCII stream) is escaped."""
    if _QUIET.get() or _STDOUT_LOST:
        return
    try:
        try:
            print(message, flush=True)
        except UnicodeEncodeError:
            encoding = getattr(sys.stdout, "encoding", None) or "ascii"
            print(message.encode(encoding, "backslashreplace").decode(encoding), flush=True)
    except OSError as err:
        _lose_stdout(err)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console as _Console

    class _StdoutConsole(_Console):
        """rich's console, but a reader gone away stops the output, not the process."""

        def on_broken_pipe(self) -> None:  # rich >= 13.4 calls this instead of raising
            self.quiet = True
            _lose_stdout(BrokenPipeError(32, "Broken pipe"))

    return _StdoutConsole


def _console() -> Console:
    """A console on stdout for the progress display and the summary table."""
    return _console_class()()


def _print(console: Console, renderable: Any, **kwargs: Any) -> None:
    """``console.print``, surviving a reader gone away (older rich raises the OSError)."""
    if _STDOUT_LOST and console.file is sys.stdout:
        return
    try:
        console.print(renderable, **kwargs)
    except OSError as err:
        console.quiet = True
        _lose_stdout(err)


# (metrics key, short label) shown live and in plain progress lines.
_DISPLAY_METRICS: tuple[tuple[str, str], ...] = (
    ("env_steps_per_s", "steps/s"),
    ("episode_return", "return"),
    ("loss", "loss"),
    ("grad_norm_pre_clip", "grad_norm"),
    ("grad_norm_post_clip", "clipped_norm"),
    ("lr", "lr"),
    ("epsilon", "eps"),
    ("eval_return", "eval"),
)


def _format_number(value: object) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        x = float(value)
        if not math.isfinite(x):
            return str(x)
        return f"{x:.4g}"
    return str(value)


def _format_metrics(metrics: Mapping[str, object], fallback_rate: float | None = None) -> str:
    # Only .get() on the mapping: rich renders from its own thread while update() writes to it.
    parts = []
    for key, label in _DISPLAY_METRICS:
        value = metrics.get(key)
        if value is None and key == "env_steps_per_s":
            value = fallback_rate
        if value is not None:
            parts.append(f"{label} {_format_number(value)}")
    return " | ".join(parts)


class ProgressDisplay:
    """A live progress bar with the latest metrics, or sparse plain lines when not on a terminal.

    ``update`` only stores values; rich redraws on its own timer, so calling it every step is
    cheap. On a non-terminal console (CI logs, files) a plain line is printed at most once per
    10% of ``total_env_steps``; pass a ``Console(force_terminal=True)`` to force the live bar.
    Metrics keep their last non-None value, since they arrive at different cadences.
    """

    def __init__(
        self,
        total_env_steps: int,
        *,
        enabled: bool = True,
        console: Console | None = None,
        description: str = "training",
    ) -> None:
        if total_env_steps <= 0:
            raise ValueError(f"total_env_steps must be positive, got {total_env_steps}")
        self.total_env_steps = int(total_env_steps)
        self.enabled = enabled
        self._latest: dict[str, object] = {}
        self._env_steps = 0
        self._progress: Any = None
        self._console: Console | None = None
        self._closed = False
        if not enabled:
            return
        self._console = console if console is not None else _console()
        self._start = time.monotonic()
        self._last_printed_steps: int | None = None
        self._next_print_steps = 0
        if self._console.is_terminal:
            self._progress = self._make_progress(description)
            self._task = self._progress.add_task(
                description, total=self.total_env_steps, metrics=self._latest
            )
            self._progress.start()

    @property
    def live(self) -> bool:
        """Whether a live rich bar is shown (enabled and on a terminal or forced one)."""
        return self._progress is not None

    def _make_progress(self, description: str) -> Any:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        class _MetricsColumn(ProgressColumn):
            """Formats the metrics dict at render time, so update() formats nothing."""

            def render(self, task: Task) -> Text:
                # Until the trainer reports a rate, show rich's own estimate.
                text = _format_metrics(task.fields.get("metrics", {}), fallback_rate=task.speed)
                return Text(text, style="cyan")

        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            _MetricsColumn(),
            console=self._console,
            refresh_per_second=4,
            transient=False,
            redirect_stdout=True,
        )

    def update(self, env_steps: int, metrics: Mapping[str, object] | None = None) -> None:
        """Record progress and the latest metrics; draws nothing itself in live mode."""
        if not self.enabled or self._closed:
            return
        self._env_steps = int(env_steps)
        if metrics:
            for key, value in metrics.items():
                if value is not None:
                    self._latest[key] = value
        if self._progress is not None:
            self._progress.update(self._task, completed=self._env_steps)
        elif self._env_steps >= self._next_print_steps:
            self._print_line()
            # Next line at the next 10% boundary strictly above the current step.
            tenth = self._env_steps * 10 // self.total_env_steps + 1
            self._next_print_steps = -(-tenth * self.total_env_steps // 10)

    def _print_line(self) -> None:
        assert self._console is not None
        pct = 100.0 * self._env_steps / self.total_env_steps
        elapsed = time.monotonic() - self._start
        parts = [
            f"[{pct:5.1f}%] env_steps {self._env_steps:,}/{self.total_env_steps:,}",
            f"elapsed {elapsed:.0f}s",
        ]
        metrics = _format_metrics(self._latest)
        if metrics:
            parts.append(metrics)
        _print(self._console, " | ".join(parts), markup=False, highlight=False, soft_wrap=True)
        self._last_printed_steps = self._env_steps

    def close(self) -> None:
        """Stop the live bar (leaving its last frame) or print a final plain line."""
        if not self.enabled or self._closed:
            return
        self._closed = True
        if self._progress is not None:
            try:
                self._progress.stop()
            except OSError as err:  # the terminal hung up
                _lose_stdout(err)
        elif self._last_printed_steps != self._env_steps:
            self._print_line()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def print_summary(summary: Mapping[str, object], console: Console | None = None) -> None:
    """Print an end-of-training table; nested mappings are flattened to ``outer.inner`` rows.
    Not printed in a :func:`quiet` block unless ``console`` is given."""
    if console is None and _QUIET.get():
        return
    from rich.table import Table

    table = Table(title="foxhunt training summary", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def add(prefix: str, mapping: Mapping[str, object]) -> None:
        for key, value in mapping.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                add(f"{name}.", value)
            else:
                table.add_row(name, "-" if value is None else _format_number(value))

    add("", summary)
    _print(console if console is not None else _console(), table)
