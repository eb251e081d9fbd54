"""Tests for foxhunt.logging (imported by name: the module shadows the stdlib ``logging``)."""

from __future__ import annotations

import io
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from foxhunt.errors import FoxhuntError
from foxhunt.logging import (
    METRIC_COLUMNS,
    WALL_CLOCK_COLUMNS,
    MetricLogger,
    ProgressDisplay,
    print_summary,
)

EXPECTED_COLUMNS = (
    "time_s,env_steps,optimizer_steps,episodes,episode_return,episode_length,loss,"
    "grad_norm_pre_clip,grad_norm_post_clip,clipped,clip_rate,q_mean,lr,epsilon,beta,"
    "effective_batch_size,env_steps_per_s,updates_per_s,skipped_steps,eval_return"
)


def _row(env_steps: int, **extra: float | int | None) -> dict[str, float | int | None]:
    row: dict[str, float | int | None] = {
        "env_steps": env_steps,
        "loss": 1.0 / (env_steps + 3),
        "epsilon": 0.1,
    }
    row.update(extra)
    return row


def test_columns_are_fixed_and_ordered() -> None:
    assert ",".join(METRIC_COLUMNS) == EXPECTED_COLUMNS
    assert set(WALL_CLOCK_COLUMNS) <= set(METRIC_COLUMNS)


def test_header_and_rows_exact(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, tensorboard=False) as logger:
        logger.log({"time_s": 0.5, "env_steps": 100, "loss": 0.25, "clipped": True, "lr": 1e-4})
        logger.log({"env_steps": 200, "episode_return": -3, "eval_return": None})
    empty_20 = [""] * 20
    row1 = list(empty_20)
    row1[0], row1[1], row1[6], row1[9], row1[12] = "0.5", "100", "0.25", "1", "0.0001"
    row2 = list(empty_20)
    row2[1], row2[4] = "200", "-3"
    expected = EXPECTED_COLUMNS + "\n" + ",".join(row1) + "\n" + ",".join(row2) + "\n"
    assert (tmp_path / "metrics.csv").read_text() == expected


def test_floats_round_trip_exactly_and_numpy_scalars(tmp_path: Path) -> None:
    values = [0.1 + 0.2, 1.0 / 3.0, 1e-300, 123456789.123456789, -2.5e17]
    with MetricLogger(tmp_path, columns=("a", "b", "c"), tensorboard=False) as logger:
        for v in values:
            logger.log({"a": v, "b": np.float32(v) if abs(v) < 1e30 else None})
        logger.log({"a": math.inf, "b": math.nan, "c": np.int64(7)})
        logger.log({"c": np.bool_(False)})
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == "a,b,c"
    for line, v in zip(lines[1:], values, strict=False):
        a, b, c = line.split(",")
        assert float(a) == v  # exact, not approximate
        assert float(b) == float(np.float32(v))
        assert c == ""
    assert lines[-2] == "inf,nan,7"
    assert lines[-1] == ",,0"


def test_unknown_key_raises_and_writes_nothing(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, tensorboard=False) as logger:
        logger.log(_row(1))
        before = (tmp_path / "metrics.csv").read_bytes()
        with pytest.raises(ValueError, match="grad_nrom"):
            logger.log({"env_steps": 2, "grad_nrom": 1.0})
        with pytest.raises(TypeError, match="'loss'"):
            logger.log({"env_steps": 2, "loss": "0.5"})  # type: ignore[dict-item]
        assert (tmp_path / "metrics.csv").read_bytes() == before


def test_rows_are_flushed_without_close(tmp_path: Path) -> None:
    logger = MetricLogger(tmp_path, tensorboard=False)
    logger.log(_row(5))
    # Read through a separate handle while the logger is still open (as after a crash).
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 2
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(RuntimeError):
        logger.log(_row(6))


def test_identical_rows_give_byte_identical_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [
        _row(i * 10, q_mean=float(rng.normal()), clip_rate=float(rng.random())) for i in range(50)
    ]
    for name in ("a", "b"):
        with MetricLogger(tmp_path / name, tensorboard=False) as logger:
            for row in rows:
                logger.log(dict(row))
    assert (tmp_path / "a" / "metrics.csv").read_bytes() == (
        tmp_path / "b" / "metrics.csv"
    ).read_bytes()


def test_fresh_logger_replaces_old_file(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, tensorboard=False) as logger:
        logger.log(_row(1))
    with MetricLogger(tmp_path, tensorboard=False):
        pass
    assert (tmp_path / "metrics.csv").read_text() == EXPECTED_COLUMNS + "\n"


def test_resume_keeps_rows_and_header_once(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, tensorboard=False) as logger:
        for step in (10, 20, 30):
            logger.log(_row(step))
    with MetricLogger(tmp_path, tensorboard=False, resume=True) as logger:
        logger.log(_row(40))
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == EXPECTED_COLUMNS
    assert lines.count(EXPECTED_COLUMNS) == 1
    assert [line.split(",")[1] for line in lines[1:]] == ["10", "20", "30", "40"]


def test_resume_without_existing_file_starts_fresh(tmp_path: Path) -> None:
    with MetricLogger(tmp_path / "new", tensorboard=False, resume=True) as logger:
        logger.log(_row(1))
    assert (tmp_path / "new" / "metrics.csv").read_text().splitlines()[0] == EXPECTED_COLUMNS


def test_truncate_after_env_steps_matches_uninterrupted_run(tmp_path: Path) -> None:
    steps = [100, 200, 300, 400, 500]
    with MetricLogger(tmp_path / "full", tensorboard=False) as logger:
        for s in steps:
            logger.log(_row(s))
    # Crashed run: logged up to 500, but the last checkpoint was taken at env_steps=300.
    with MetricLogger(tmp_path / "crash", tensorboard=False) as logger:
        for s in steps:
            logger.log(_row(s, q_mean=-1.0))  # different values after the checkpoint...
    with MetricLogger(
        tmp_path / "crash", tensorboard=False, resume=True, truncate_after_env_steps=300
    ) as logger:
        text = (tmp_path / "crash" / "metrics.csv").read_text()
        assert [line.split(",")[1] for line in text.splitlines()[1:]] == ["100", "200", "300"]
        for s in steps[3:]:
            logger.log(_row(s))
    # ...are gone; rows before it were identical except q_mean, so rewrite those to compare.
    full = (tmp_path / "full" / "metrics.csv").read_text().splitlines()
    resumed = (tmp_path / "crash" / "metrics.csv").read_text().splitlines()
    assert len(resumed) == len(full)
    assert resumed[4:] == full[4:]
    assert [r.replace("-1.0", "") for r in resumed[:4]] == full[:4]
    assert not [p for p in (tmp_path / "crash").iterdir() if p.name.endswith(".tmp")]


def test_resume_drops_torn_last_line(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, tensorboard=False) as logger:
        logger.log(_row(10))
    path = tmp_path / "metrics.csv"
    good = path.read_text()
    path.write_text(good + "0.1,20,,,1.5")  # crash mid-write: no newline, missing cells
    with MetricLogger(tmp_path, tensorboard=False, resume=True) as logger:
        assert path.read_text() == good
        logger.log(_row(20))
    assert path.read_text().count("\n") == 3


def test_resume_rejects_other_header(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("a,b\n1,2\n")
    with pytest.raises(FoxhuntError, match=r"metrics\.csv.*'a,b'"):
        MetricLogger(tmp_path, tensorboard=False, resume=True)


def test_truncate_requires_resume(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="resume"):
        MetricLogger(tmp_path, tensorboard=False, truncate_after_env_steps=10)


def test_bad_columns_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unique"):
        MetricLogger(tmp_path, columns=("a", "a"), tensorboard=False)
    with pytest.raises(ValueError, match="column name"):
        MetricLogger(tmp_path, columns=("a,b",), tensorboard=False)


def test_tensorboard_scalars_use_env_steps(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    with MetricLogger(tmp_path) as logger:
        assert logger.tensorboard_enabled
        logger.log({"env_steps": 100, "loss": 0.5, "eval_return": None})
        logger.log({"env_steps": 200, "loss": 0.25, "eval_return": 3.0})
    event_files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1
    acc = ea.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "eval_return"} <= tags
    assert "env_steps" not in tags and "q_mean" not in tags
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(100, 0.5), (200, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("eval_return")] == [(200, 3.0)]


def test_missing_tensorboard_only_disables_that_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import -> ImportError
    with pytest.warns(RuntimeWarning, match="TensorBoard"):
        logger = MetricLogger(tmp_path)
    with logger:
        assert not logger.tensorboard_enabled
        logger.log(_row(1))
    assert not (tmp_path / "tensorboard").exists()
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 2


# -- progress display ------------------------------------------------------------------------


def test_disabled_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True)
    with ProgressDisplay(100, enabled=False, console=console) as display:
        for step in range(0, 101, 5):
            display.update(step, {"loss": 0.1})
    assert buffer.getvalue() == ""
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_forced_terminal_progress_renders_metrics() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200)
    display = ProgressDisplay(1000, console=console)
    assert display.live
    for step in range(1, 1001):
        display.update(step, {"loss": 0.125, "epsilon": 0.5, "eval_return": None})
    display.update(1000, {"grad_norm_pre_clip": 12.0, "grad_norm_post_clip": 10.0})
    display.update(1000, {"eval_return": 7.5, "loss": None})  # None keeps the last loss
    display.close()
    display.close()
    display.update(1000, {"loss": 1.0})  # after close: ignored, no crash
    out = buffer.getvalue()
    assert "1000/1000" in out
    assert "loss 0.125" in out and "eps 0.5" in out and "eval 7.5" in out
    # Norms, not a flag: the post-clip value is labelled as a norm.
    assert "grad_norm 12" in out and "clipped_norm 10" in out


@pytest.mark.parametrize("total", [1000, 7])
def test_non_terminal_progress_prints_sparse_plain_lines(total: int) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=80)  # a StringIO is not a terminal
    with ProgressDisplay(total, console=console) as display:
        assert not display.live
        for step in range(total + 1):
            display.update(step, {"episode_return": float(step), "loss": 0.5})
    lines = buffer.getvalue().splitlines()
    assert 2 <= len(lines) <= 11
    assert "\x1b[" not in buffer.getvalue()  # no escape codes in CI logs
    percents = [float(line[1:6]) for line in lines]
    assert percents == sorted(percents)
    assert all(b - a >= 10.0 for a, b in itertools.pairwise(percents))
    assert percents[-1] == 100.0
    assert f"env_steps {total:,}/{total:,}" in lines[-1]
    assert f"return {float(total):.4g}" in lines[-1]


def test_default_console_on_non_tty_stdout_is_plain(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(var, raising=False)
    with ProgressDisplay(100) as display:
        for step in range(101):
            display.update(step)
    out = capsys.readouterr().out
    assert "\x1b[" not in out
    assert 1 <= len(out.splitlines()) <= 11


def test_progress_rejects_nonpositive_total() -> None:
    with pytest.raises(ValueError, match="total_env_steps"):
        ProgressDisplay(0)


def test_print_summary_table() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=100)
    print_summary(
        {"env_steps": 12345, "final_loss": 0.000123456, "eval": {"best_return": 2.5}, "x": None},
        console=console,
    )
    out = buffer.getvalue()
    assert "12,345" in out
    assert "0.0001235" in out
    assert "eval.best_return" in out and "2.5" in out


def test_every_evaluation_is_logged_at_its_own_step() -> None:
    """eval_interval not a multiple of log_interval: each evaluation gets a row at its step
    (held for the next boundary, it was plotted elsewhere and a second one replaced it)."""
    from foxhunt import DQNHyperparameters, DQNTrainer

    hp = DQNHyperparameters.cartpole(
        n_envs=1, log_interval=400, eval_interval=300, eval_episodes=1, learning_starts=100,
        train_freq=50, gradient_steps=1, hidden_sizes=[16], torch_threads=1,
    )  # fmt: skip
    trainer = DQNTrainer(hp, "CartPole-v1")
    rows: list[dict] = []
    summary = trainer.learn(1000, callback=rows.append)
    logged = [(r["env_steps"], r["eval_return"]) for r in rows if r["eval_return"] is not None]
    best = max(ret for _, ret in logged)
    assert summary["best_eval_return"] == best  # and the step it was reached at, first
    assert summary["best_eval_env_steps"] == next(s for s, ret in logged if ret == best)
    assert logged == trainer.eval_history == [(300, logged[0][1]), *logged[1:]]
    assert [s for s, _ in logged] == [300, 600, 900]
    assert {r["env_steps"] for r in rows} >= {400, 800, 1000}


def test_row_rates_and_time_count_training_only() -> None:
    """The first row's rates and time_s start with learn(), not the trainer's construction."""
    from foxhunt import DQNHyperparameters, DQNTrainer

    hp = DQNHyperparameters.cartpole(
        n_envs=1, log_interval=200, eval_interval=0, learning_starts=1_000, hidden_sizes=[16],
        torch_threads=1,
    )  # fmt: skip
    trainer = DQNTrainer(hp, "CartPole-v1")
    time.sleep(0.5)
    rows: list[dict] = []
    summary = trainer.learn(200, callback=rows.append)
    assert rows[0]["time_s"] <= summary["wall_time_s"] + 1e-3
    assert rows[0]["env_steps_per_s"] >= 0.5 * summary["env_steps_per_s"]
    time.sleep(0.5)
    rows.clear()
    trainer.learn(400, callback=rows.append)
    assert rows[0]["time_s"] < 0.5 + summary["wall_time_s"]
