"""Static training report: PNG curves and an ``index.html`` built from a run's ``metrics.csv``.

Plots are drawn on :class:`~matplotlib.backends.backend_agg.FigureCanvasAgg` directly rather
than through ``pyplot``, so writing a report never changes the caller's matplotlib backend or
global figure state (safe inside notebooks and from worker threads).
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from foxhunt._io import atomic_write_many
from foxhunt.errors import FoxhuntError, first_line

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["read_metrics", "write_run_report"]

_INDEX = "index.html"


def read_metrics(path: Path) -> pd.DataFrame:
    """Read a metrics CSV into numeric columns (unparseable cells become NaN).

    Raises :class:`FoxhuntError` naming the file when it is missing, empty or not a CSV.
    """
    return _numeric(_read_cells(Path(path)))


def _read_cells(path: Path) -> pd.DataFrame:
    """The metrics CSV's cells as written (text; an empty cell stays ""), read once for both
    the numbers and where a nan or inf was written."""
    import pandas as pd

    if not path.is_file():
        raise FoxhuntError(f"metrics file {path} does not exist")
    try:
        cells = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise FoxhuntError(f"metrics file {path} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise FoxhuntError(f"metrics file {path} is not a valid CSV: {first_line(exc)}") from None
    if cells.empty:
        raise FoxhuntError(f"metrics file {path} has a header but no rows")
    return cells


def _numeric(cells: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    return cells.apply(pd.to_numeric, errors="coerce").astype("float64")


# -- plots ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plot:
    name: str
    title: str
    columns: tuple[str, ...]
    ylabel: str
    log_when_positive: bool = False


def _xy(frame: pd.DataFrame, x: str, column: str) -> tuple[pd.Series, pd.Series]:
    valid = frame[[x, column]].dropna()
    return valid[x], valid[column]


def _has_data(frame: pd.DataFrame, column: str) -> bool:
    return column in frame.columns and bool(frame[column].notna().any())


def _marker(n: int) -> str | None:
    """Dots on short series: a single logged row draws no line at all, only a dot shows it."""
    return "o" if n <= 20 else None


def _rolling_window(n: int) -> int:
    """About a tenth of the points, between 1 and 100: smooth but still responsive."""
    return max(1, min(100, n // 10))


def _episode_weighted_mean(frame: pd.DataFrame, returns: pd.Series, window: int) -> pd.Series:
    """Rolling mean of ``returns`` (each row's mean over the episodes that ended in it) weighted
    by how many episodes each row holds, from the running ``episodes`` total: a row of one
    long episode and a row of twenty short ones then count as the twenty-one episodes they are,
    not as two equal means. Rows without that count weigh one."""
    import pandas as pd

    weights = pd.Series(1.0, index=returns.index)
    if "episodes" in frame.columns:
        total = frame["episodes"].ffill()
        ended = total.diff().fillna(total)  # the first row: every episode before it
        ended = ended.reindex(returns.index)
        weights = ended.where(ended > 0, 1.0)
    weighted = (returns * weights).rolling(window, min_periods=1).sum()
    return weighted / weights.rolling(window, min_periods=1).sum()


def _draw_returns(ax: Axes, frame: pd.DataFrame, x: str) -> None:
    if _has_data(frame, "episode_return"):
        xs, ys = _xy(frame, x, "episode_return")
        window = _rolling_window(len(ys))
        ax.plot(
            xs,
            ys,
            color="tab:blue",
            alpha=0.3,
            linewidth=0.8,
            marker=_marker(len(ys)),
            markersize=3,
            label="episode return",
        )
        ax.plot(
            xs,
            _episode_weighted_mean(frame, ys, window),
            color="tab:blue",
            linewidth=1.8,
            label=f"rolling mean ({window} row{'s' if window != 1 else ''}, per episode)",
        )
    if _has_data(frame, "eval_return"):
        xs, ys = _xy(frame, x, "eval_return")
        ax.plot(xs, ys, color="tab:orange", marker="o", markersize=3, label="eval return")


def _draw_lines(ax: Axes, frame: pd.DataFrame, x: str, plot: _Plot) -> None:
    all_positive = True
    for column in plot.columns:
        if not _has_data(frame, column):
            continue
        xs, ys = _xy(frame, x, column)
        all_positive = all_positive and bool((ys > 0).all())
        ax.plot(xs, ys, linewidth=1.2, marker=_marker(len(ys)), markersize=3, label=column)
    # Gradient norms span orders of magnitude; a log axis needs strictly positive values.
    if plot.log_when_positive and all_positive:
        ax.set_yscale("log")


_RETURNS = _Plot(
    "returns", "Episode and evaluation return", ("episode_return", "eval_return"), "return"
)
_PLOTS: tuple[_Plot, ...] = (
    _RETURNS,
    _Plot("loss", "Loss", ("loss",), "loss"),
    _Plot(
        "grad_norm",
        "Global gradient norm (before / after clipping)",
        ("grad_norm_pre_clip", "grad_norm_post_clip"),
        "norm",
        log_when_positive=True,
    ),
    _Plot("clip_rate", "Clip rate", ("clip_rate",), "fraction of updates clipped"),
    _Plot("q_mean", "Mean Q value", ("q_mean",), "Q"),
    _Plot("lr", "Learning rate", ("lr",), "lr"),
    _Plot("exploration", "Exploration (epsilon) and PER beta", ("epsilon", "beta"), "value"),
)

_THROUGHPUT = ("env_steps_per_s", "updates_per_s")


def _render_png(draw: Callable[[Figure], None]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    draw(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _single_axes_figure(plot: _Plot, frame: pd.DataFrame, x: str) -> bytes:
    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        if plot is _RETURNS:
            _draw_returns(ax, frame, x)
        else:
            _draw_lines(ax, frame, x, plot)
        ax.set_ylabel(plot.ylabel)
        ax.set_title(plot.title)
        ax.set_xlabel(x)
        ax.grid(True, alpha=0.3)
        if len(ax.get_lines()) > 1:
            ax.legend(loc="best", fontsize="small")

    return _render_png(draw)


def _throughput_figure(frame: pd.DataFrame, x: str) -> bytes:
    """Env steps/s and updates/s differ by orders of magnitude: one panel each, shared x."""
    present = [c for c in _THROUGHPUT if _has_data(frame, c)]

    def draw(fig: Figure) -> None:
        axes = fig.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
        for ax, column in zip(axes, present, strict=True):
            xs, ys = _xy(frame, x, column)
            ax.plot(xs, ys, linewidth=1.2, marker=_marker(len(ys)), markersize=3)
            ax.set_ylabel(column)
            ax.grid(True, alpha=0.3)
        axes[0].set_title("Throughput")
        axes[-1].set_xlabel(x)

    return _render_png(draw)


# -- summary and html ------------------------------------------------------------------------

_MAXIMIZED = ("episode_return", "eval_return")


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"  # as the backtest tables write it
    if isinstance(value, float) and value == int(value):
        return f"{int(value):,}" if abs(value) < 1e15 else f"{value:.6g}"
    return f"{value:.6g}"


_NONFINITE_TEXT = frozenset({"nan", "inf", "+inf", "-inf", "infinity", "-infinity"})


def _written_nonfinite(cells: pd.DataFrame) -> pd.DataFrame:
    """Where metrics.csv holds a written nan or inf (a diverged loss), as opposed to an empty
    cell (a metric with nothing to say on that row, such as eval_return between evaluations):
    read back as numbers, both are NaN."""
    return cells.apply(lambda column: column.str.strip().str.lower().isin(_NONFINITE_TEXT))


def _halt_alert(run_dir: Path) -> str | None:
    """The health monitor's stop, from ``halted.json``, at the top of the page."""
    path = run_dir / "halted.json"
    if not path.is_file():
        return None
    try:
        message = json.loads(path.read_text(encoding="utf-8")).get("message")
    except (OSError, ValueError, AttributeError, RecursionError):
        message = None
    return f"{message}." if isinstance(message, str) else f"{path} is unreadable."


def _nonfinite_alert(nonfinite: pd.DataFrame) -> str | None:
    """A line at the top of the page when any logged value is nan or inf: the summary's final
    values say so per metric, but a diverged run should not need a table read to be seen."""
    rows = nonfinite.any(axis=1)
    if not rows.any():
        return None
    columns = [str(c) for c in nonfinite.columns if nonfinite[c].any()]
    return (
        f"{int(rows.sum())} logged row(s) hold non-finite values ({', '.join(columns)}): "
        "training diverged or skipped steps; summary.json's health events (or the run's "
        "warnings) say which"
    )


def _summary_rows(
    frame: pd.DataFrame, x: str, nonfinite: pd.DataFrame
) -> list[tuple[str, str, str, str, str]]:
    """(metric, final, min, max, best) for every column with a value written: the final value is
    the last one written, non-finite or not (a diverged run must not read as its last good
    row), and min, max and best are over the finite ones."""
    rows = []
    for column in frame.columns:
        bad = nonfinite[column]
        written = frame[column].notna() | bad
        if not written.any():
            continue
        cells = frame.loc[written, column]
        finite = cells[cells.map(math.isfinite)]
        final = _fmt(float(cells.iloc[-1]))
        if bad.any():
            final += f" ({int(bad.sum())} non-finite)"
        low, high = (_fmt(finite.min()), _fmt(finite.max())) if len(finite) else ("n/a", "n/a")
        best = ""
        if column in _MAXIMIZED and len(finite):
            at = finite.idxmax()
            where = frame.at[at, x] if x in frame.columns else at
            best = f"{_fmt(finite.max())} at {x} {_fmt(float(where))}"
        rows.append((column, final, low, high, best))
    return rows


def _backtest_links(run_dir: Path) -> list[tuple[str, str]]:
    """(href from the report folder, label) of every backtest ``foxhunt evaluate`` wrote: the
    final model's on the test span (``backtest/``) first, then the other models and splits
    (``backtest_best/``, ``backtest_validation/``, ...)."""
    links = []
    for page in sorted(run_dir.glob("backtest*/report.html"), key=lambda p: p.parent.name):
        name = page.parent.name
        if name != "backtest" and not name.startswith("backtest_"):
            continue
        what = name.removeprefix("backtest").strip("_").replace("_", ", ")
        label = f"Backtest report ({what})" if what else "Backtest report"
        links.append((f"../{name}/report.html", label))
    return links


def _html(
    run_dir: Path,
    images: Sequence[tuple[str, str]],
    summary: Sequence[tuple[str, ...]],
    config_text: str | None,
    backtests: Sequence[tuple[str, str]],
    n_rows: int,
    alert: str | None = None,
) -> str:
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>foxhunt run report: {esc(run_dir.name)}</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}"
        "td{text-align:right}td:first-child{text-align:left}img{max-width:100%}"
        "pre{background:#f5f5f5;padding:1em;overflow-x:auto}</style>",
        "</head><body>",
        f"<h1>foxhunt run report: {esc(run_dir.name)}</h1>",
        f"<p>{n_rows} logged rows from <code>metrics.csv</code>.</p>",
    ]
    if alert is not None:
        parts.append(f"<p><strong>{esc(alert)}</strong></p>")
    for href, label in backtests:
        parts.append(f'<p><a href="{esc(href)}">{esc(label)}</a></p>')
    parts.append("<h2>Summary</h2><table>")
    parts.append("<tr><th>metric</th><th>final</th><th>min</th><th>max</th><th>best</th></tr>")
    for row in summary:
        parts.append("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>")
    parts.append("</table>")
    if images:
        parts.append("<h2>Curves</h2>")
    for filename, title in images:
        parts.append(
            f'<figure><img src="{esc(filename)}" alt="{esc(title)}">'
            f"<figcaption>{esc(title)}</figcaption></figure>"
        )
    if config_text is not None:
        parts.append(f"<h2>Resolved config</h2><pre>{esc(config_text)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_run_report(run_dir: Path) -> dict[str, Path]:
    """Write ``run_dir/report/`` (one PNG per curve present, plus ``index.html``).

    Curves whose columns are entirely empty are skipped. Returns ``{name: path}`` with one entry
    per PNG written and ``"index"`` for the HTML page. Raises :class:`FoxhuntError` when the run
    directory or its metrics are missing or empty.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FoxhuntError(f"run directory {run_dir} does not exist")
    cells = _read_cells(run_dir / "metrics.csv")
    frame = _numeric(cells)
    x = "env_steps" if _has_data(frame, "env_steps") else "row"
    if x == "row":
        frame = frame.assign(row=range(len(frame)))

    out_dir = run_dir / "report"
    written: dict[str, Path] = {}
    contents: dict[Path, bytes] = {}  # written together at the end, all or nothing
    images: list[tuple[str, str]] = []

    for plot in _PLOTS:
        if not any(_has_data(frame, column) for column in plot.columns):
            continue
        path = out_dir / f"{plot.name}.png"
        contents[path] = _single_axes_figure(plot, frame, x)
        written[plot.name] = path
        images.append((path.name, plot.title))
    if any(_has_data(frame, column) for column in _THROUGHPUT):
        path = out_dir / "throughput.png"
        contents[path] = _throughput_figure(frame, x)
        written["throughput"] = path
        images.append((path.name, "Throughput"))

    config_path = run_dir / "config.yaml"
    config_text = (
        config_path.read_text(encoding="utf-8", errors="replace") if config_path.is_file() else None
    )
    backtests = _backtest_links(run_dir)
    nonfinite = _written_nonfinite(cells)
    summary = _summary_rows(frame.drop(columns=["row"], errors="ignore"), x, nonfinite)
    alerts = [a for a in (_halt_alert(run_dir), _nonfinite_alert(nonfinite)) if a is not None]
    page = _html(
        run_dir,
        images,
        summary,
        config_text,
        backtests,
        len(frame),
        " ".join(alerts) or None,
    )
    index = out_dir / _INDEX
    contents[index] = page.encode("utf-8")
    atomic_write_many(contents)
    written["index"] = index
    return written
