"""Tests for foxhunt.report: PNG curves and index.html from a run directory."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from foxhunt.errors import FoxhuntError
from foxhunt.logging import METRIC_COLUMNS
from foxhunt.report import read_metrics, write_run_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EMPTY_COLUMNS = ("clip_rate", "q_mean", "beta", "skipped_steps", "episode_length")


def _write_run(run_dir: Path, n: int = 60) -> pd.DataFrame:
    """A synthetic run: every column present, some entirely empty, eval every 10th row."""
    run_dir.mkdir(parents=True)
    steps = np.arange(n) * 100
    frame = pd.DataFrame({col: np.full(n, np.nan) for col in METRIC_COLUMNS})
    frame["time_s"] = np.arange(n) * 0.5
    frame["env_steps"] = steps
    frame["optimizer_steps"] = steps // 4
    frame["episode_return"] = np.sin(np.arange(n) / 5.0)
    frame["loss"] = 1.0 / (np.arange(n) + 1.0)
    frame["grad_norm_pre_clip"] = 20.0 / (np.arange(n) + 1.0)
    frame["grad_norm_post_clip"] = np.minimum(frame["grad_norm_pre_clip"], 1.0)
    frame["lr"] = 1e-3
    frame["epsilon"] = np.maximum(0.05, 1.0 - np.arange(n) / 30.0)
    frame["env_steps_per_s"] = 1000.0
    frame["updates_per_s"] = 250.0
    eval_rows = np.arange(n) % 10 == 0
    frame.loc[eval_rows, "eval_return"] = [1.0, 4.0, 2.0, 3.0, 4.0, 0.5][: int(eval_rows.sum())]
    frame.to_csv(run_dir / "metrics.csv", index=False)
    return frame


def _summary_table(page: str) -> dict[str, list[str]]:
    """The summary table's rows of index.html: metric -> [final, min, max, best]."""
    rows = (re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", page))
    return {cells[0]: cells[1:] for cells in rows if cells}


def test_report_writes_pngs_index_config_and_backtest_link(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run)
    (run / "config.yaml").write_text("agent:\n  lr: 0.001  # <tuned> & kept\n")
    (run / "backtest").mkdir()
    (run / "backtest" / "report.html").write_text("<html>backtest</html>")
    (run / "backtest_best_validation").mkdir()  # another model and split, beside it
    (run / "backtest_best_validation" / "report.html").write_text("<html>best</html>")
    (run / "backtest_notes").mkdir()  # a folder of the user's own: linked only with a report

    written = write_run_report(run)

    plots = {"returns", "loss", "grad_norm", "lr", "exploration", "throughput"}
    assert set(written) == plots | {"index"}  # clip_rate and q_mean are empty: skipped
    report_dir = run / "report"
    for name in plots:
        path = written[name]
        assert path.parent == report_dir and path.suffix == ".png"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
    assert not (report_dir / "clip_rate.png").exists()
    assert not (report_dir / "q_mean.png").exists()
    assert not [p.name for p in report_dir.iterdir() if p.name.endswith(".tmp")]

    page = written["index"].read_text()
    assert written["index"] == report_dir / "index.html"
    srcs = set(re.findall(r'<img src="([^"]+)"', page))
    assert srcs == {f"{name}.png" for name in plots}
    href = re.search(r'<a href="([^"]+)">Backtest report</a>', page)
    assert href is not None
    assert (report_dir / href.group(1)).resolve() == (run / "backtest" / "report.html").resolve()
    links = re.findall(r'<a href="([^"]+)">(Backtest report[^<]*)</a>', page)
    assert links == [
        ("../backtest/report.html", "Backtest report"),
        ("../backtest_best_validation/report.html", "Backtest report (best, validation)"),
    ]
    # The config is shown verbatim, HTML-escaped.
    assert "<pre>agent:\n  lr: 0.001  # &lt;tuned&gt; &amp; kept\n</pre>" in page


def test_report_summary_values(tmp_path: Path) -> None:
    run = tmp_path / "run"
    frame = _write_run(run)
    page = write_run_report(run)["index"].read_text()
    rows = _summary_table(page)
    # Hand computation: eval returns [1, 4, 2, 3, 4, 0.5] at env_steps 0, 1000, ..., 5000;
    # the best (first maximum) is 4 at env_steps 1000, the last is 0.5.
    assert rows["eval_return"] == ["0.5", "0.5", "4", "4 at env_steps 1,000"]
    assert rows["env_steps"][:3] == ["5,900", "0", "5,900"]
    final_loss = 1.0 / 60.0
    assert rows["loss"][0] == f"{final_loss:.6g}"
    best_ret = frame["episode_return"].max()
    best_at = int(frame["env_steps"][frame["episode_return"].idxmax()])
    assert rows["episode_return"][3] == f"{best_ret:.6g} at env_steps {best_at:,}"
    for empty in EMPTY_COLUMNS:
        assert empty not in rows


def test_report_without_optional_files_or_env_steps(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame({"loss": [0.5, 0.25, 0.125], "q_mean": [np.nan] * 3}).to_csv(
        run / "metrics.csv", index=False
    )
    written = write_run_report(run)
    assert set(written) == {"loss", "index"}
    page = written["index"].read_text()
    assert "Backtest report" not in page and "<pre>" not in page
    assert '<img src="loss.png"' in page


def test_grad_norm_axis_is_log_only_when_positive() -> None:
    from matplotlib.figure import Figure

    from foxhunt.report import _PLOTS, _draw_lines

    plot = next(p for p in _PLOTS if p.name == "grad_norm")
    for pre, expected in (([4.0, 2.0, 1.0], "log"), ([4.0, 0.0, 1.0], "linear")):
        frame = pd.DataFrame(
            {"env_steps": [1, 2, 3], "grad_norm_pre_clip": pre, "grad_norm_post_clip": [1.0] * 3}
        )
        ax = Figure().add_subplot()
        _draw_lines(ax, frame, "env_steps", plot)
        assert ax.get_yscale() == expected
        assert [line.get_label() for line in ax.get_lines()] == list(plot.columns)


def test_missing_run_dir_raises(tmp_path: Path) -> None:
    with pytest.raises(FoxhuntError, match=re.escape(str(tmp_path / "nope"))):
        write_run_report(tmp_path / "nope")


def test_missing_metrics_raises(tmp_path: Path) -> None:
    with pytest.raises(FoxhuntError, match=r"metrics\.csv does not exist"):
        write_run_report(tmp_path)
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [("", "is empty"), (",".join(METRIC_COLUMNS) + "\n", "no rows")],
)
def test_empty_metrics_raise(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "metrics.csv").write_text(content)
    with pytest.raises(FoxhuntError, match=message):
        write_run_report(tmp_path)


def test_read_metrics_coerces_bad_cells(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("env_steps,loss\n1,0.5\n2,oops\n3,\n")
    frame = read_metrics(path)
    assert frame["env_steps"].tolist() == [1.0, 2.0, 3.0]
    assert frame["loss"].iloc[0] == 0.5 and frame["loss"].iloc[1:].isna().all()


def test_short_series_are_drawn_with_dots() -> None:
    """A run stopped after one metrics row has one point per curve: a line alone draws nothing,
    so short series carry dots; long ones stay plain lines."""
    from matplotlib.figure import Figure

    from foxhunt.report import _draw_lines, _draw_returns, _Plot

    plot = _Plot("loss", "Loss", ("loss",), "loss")
    for rows, marker in ((1, "o"), (20, "o"), (21, "None")):
        frame = pd.DataFrame({"env_steps": np.arange(rows) * 100, "loss": np.linspace(1, 2, rows)})
        frame["episode_return"] = frame["loss"]
        ax = Figure().subplots()
        _draw_lines(ax, frame, "env_steps", plot)
        _draw_returns(ax, frame, "env_steps")
        assert ax.lines[0].get_marker() == marker and ax.lines[1].get_marker() == marker


def test_the_rolling_episode_return_is_a_mean_over_episodes() -> None:
    """Each row's episode_return is the mean of the episodes that ended in it: the rolling line
    averaged those means as equals, so one 500-step episode outweighed twenty 10-step ones."""
    from matplotlib.figure import Figure

    from foxhunt.report import _draw_returns

    # Ten times: a row of 20 episodes returning 10, one of a single 500, one of three 40s, and a
    # row in which no episode ended. 30 rows with returns: a rolling window of 3 rows.
    ended = [20, 1, 3, 0] * 10
    means = [10.0, 500.0, 40.0, np.nan] * 10
    frame = pd.DataFrame(
        {
            "env_steps": np.arange(1, 41) * 100,
            "episodes": np.cumsum(ended),
            "episode_return": means,
        }
    )
    ax = Figure().subplots()
    _draw_returns(ax, frame, "env_steps")
    rolling = ax.lines[1].get_ydata()
    last_three_rows = [10.0] * 20 + [500.0] + [40.0] * 3
    assert len(rolling) == 30 and "3 rows, per episode" in ax.lines[1].get_label()
    assert rolling[-1] == pytest.approx(np.mean(last_three_rows))  # 34.17, not 183.3
    assert rolling[0] == 10.0 and rolling[1] == pytest.approx((200 + 500) / 21)


def test_a_diverged_run_reads_as_one(tmp_path: Path) -> None:
    """Non-finite losses at the end: the final value was the last finite one, the loss row and
    plot vanished when every value was nan, and nothing on the page said so."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text(
        "env_steps,loss,q_mean,grad_norm_pre_clip,eval_return\n"
        "100,0.5,1.0,2.0,\n"
        "200,0.25,2.0,inf,3.0\n"
        "300,nan,nan,nan,\n"  # written nan: diverged; empty eval_return: no evaluation here
        "400,nan,nan,-inf,\n"
    )
    page = write_run_report(run)["index"].read_text()
    rows = _summary_table(page)
    assert rows["loss"] == ["n/a (2 non-finite)", "0.25", "0.5", ""]
    assert rows["grad_norm_pre_clip"] == ["n/a (3 non-finite)", "2", "2", ""]
    assert rows["eval_return"] == ["3", "3", "3", "3 at env_steps 200"]  # empty cells: not bad
    assert "3 logged row(s) hold non-finite values (loss, q_mean, grad_norm_pre_clip)" in page
    assert "inf" not in page.replace("information", "")
