"""SIGKILL at any moment - including in the middle of a checkpoint save - loses nothing.

A ``foxhunt train`` process that saves every 50 env steps is killed, then resumed, and the resumed
processes are killed again at seeded random moments; a last ``foxhunt resume`` runs to the end.
After every kill the latest checkpoint must load (``CheckpointManager.load_latest``) and restore
into a freshly built trainer, and the finished run must equal an uninterrupted one bit for bit:
a crash may cost time, never correctness.
"""

from __future__ import annotations

import csv
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from _helpers import TINY_CARTPOLE
from safetensors.torch import load_file

from foxhunt.checkpoint import CheckpointManager, CheckpointWarning
from foxhunt.errors import FoxhuntError
from foxhunt.logging import WALL_CLOCK_COLUMNS

SRC = Path(__file__).resolve().parents[1] / "src"
TOTAL = 1000
TINY = {
    **TINY_CARTPOLE,
    "eval_interval": 0,
    "torch_threads": 1,
    "device": "cpu",
    "prioritized_replay": "true",
    "n_step": 3,
    "checkpoint_interval": 50,  # saves are frequent, so kills land in them
    "keep_checkpoints": 2,  # pruning runs on every save too
}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "foxhunt.cli", *args]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }


def train_args(run_dir: Path) -> list[str]:
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    return [
        "train",
        "--env",
        "CartPole-v1",
        "--total-steps",
        str(TOTAL),
        "--seed",
        "11",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        *sets,
    ]


def latest_step(run_dir: Path) -> int | None:
    """Step of the newest *complete* checkpoint (the pointer is swapped after the rename)."""
    try:
        text = (run_dir / "checkpoints" / "latest.json").read_text()
    except (FileNotFoundError, OSError):
        return None
    try:
        import json

        return int(json.loads(text)["step"])
    except (ValueError, KeyError):  # replaced atomically, so this should never happen
        return None


def kill_when(proc: subprocess.Popen, ready, deadline: float = 120.0) -> bool:
    """SIGKILL ``proc`` as soon as ``ready()`` holds; False if the process ended first."""
    end = time.monotonic() + deadline
    while proc.poll() is None and time.monotonic() < end:
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.001)
    proc.wait(timeout=60)
    return False


def assert_loadable(run_dir: Path) -> int:
    """load_latest works and its state restores into a fresh trainer; returns its step."""
    from foxhunt.runs import load_spec, make_envs
    from foxhunt.trainer import DQNTrainer
    from foxhunt.trainstate import restore_state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)  # e.g. a pointer to a pruned dir
        tensors, state, path = CheckpointManager(run_dir).load_latest()
    spec = load_spec(run_dir)
    train_env, eval_env, _ = make_envs(spec)
    trainer = DQNTrainer(spec.hyperparameters, train_env, eval_env=eval_env)
    try:
        restore_state(trainer, tensors, state)
    finally:
        trainer.close()
    assert path.name == f"step-{trainer.env_steps:012d}"
    return trainer.env_steps


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as fh:
        return [
            {k: v for k, v in r.items() if k not in WALL_CLOCK_COLUMNS} for r in csv.DictReader(fh)
        ]


class Reference:
    """The uninterrupted run, trained in the background while a test crashes its twin."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            cli(*train_args(run_dir)),
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def done(self) -> Path:
        if self.proc.returncode is None:
            _, self.err = self.proc.communicate(timeout=300)
        assert self.proc.returncode == 0, self.err
        return self.run_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return Reference(tmp_path_factory.mktemp("reference") / "run")


def assert_same_run(reference: Path, other: Path) -> None:
    a = load_file(str(reference / "model.safetensors"))
    b = load_file(str(other / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(reference) == metrics(other)
    assert len(metrics(other)) == TOTAL // 100


def test_sigkill_at_random_points_then_resume_equals_uninterrupted_run(
    tmp_path: Path, reference: Reference
) -> None:
    torch.set_num_threads(1)
    rng = random.Random(20240611)
    crashed = tmp_path / "crashed"

    # Kill 1: the training process, in the middle of a save that follows a complete one
    # (a .tmp- directory is being written while latest.json already exists).
    proc = subprocess.Popen(
        cli(*train_args(crashed)), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ckpts = crashed / "checkpoints"

    def mid_save() -> bool:
        if latest_step(crashed) is None:
            return False
        try:
            return any(n.startswith(".tmp-step-") for n in os.listdir(ckpts))
        except FileNotFoundError:
            return False

    assert kill_when(proc, mid_save), "training ended before a save could be interrupted"
    steps = [assert_loadable(crashed)]

    # Kills 2 and 3: resumed processes, at seeded random moments after they have saved again.
    for _ in range(2):
        proc = subprocess.Popen(
            cli("resume", str(crashed), "--no-progress"),
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        start = steps[-1]
        kill_at: list[float] = []

        def moved_on(start: int = start, kill_at: list[float] = kill_at) -> bool:
            step = latest_step(crashed)
            if step is None or step <= start:
                return False
            if not kill_at:
                kill_at.append(time.monotonic() + rng.uniform(0.0, 0.15))
            return time.monotonic() >= kill_at[0]

        if not kill_when(proc, moved_on):
            break  # finished before the random moment came (slow machine): nothing to kill
        steps.append(assert_loadable(crashed))
    assert len(steps) >= 2 and all(0 < s < TOTAL for s in steps) and steps == sorted(steps)

    # Every kill may leave metrics rows and a torn line past the checkpoint; resume trims them.
    done = subprocess.run(
        cli("resume", str(crashed), "--no-progress"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert not [n for n in os.listdir(ckpts) if n.startswith((".tmp-", ".old-"))]
    assert CheckpointManager(crashed).load_latest()[2].name == f"step-{TOTAL:012d}"
    assert_same_run(reference.done(), crashed)


STOPS = [
    (signal.SIGINT, 130, "interrupted (Ctrl-C)"),
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),
    (signal.SIGHUP, 129, "hung up (SIGHUP: the terminal closed)"),
]


@pytest.mark.parametrize("signum,code,said", STOPS)
def test_ctrl_c_checkpoint_resumes_exactly(
    tmp_path: Path, reference: Reference, signum: int, code: int, said: str
) -> None:
    """Ctrl-C (SIGINT), kill's SIGTERM or a closed terminal's SIGHUP (which ended the run with
    no checkpoint) saves a checkpoint; twice interrupted, the run must still be exact."""
    run_dir = tmp_path / "interrupted"
    rng = random.Random(7)
    for argv in (train_args(run_dir), ["resume", str(run_dir), "--no-progress"]):
        start = latest_step(run_dir) or 0
        proc = subprocess.Popen(
            cli(*argv), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline: list[float] = []

        def after_a_save(start: int = start, deadline: list[float] = deadline) -> bool:
            if (latest_step(run_dir) or 0) <= start:
                return False
            if not deadline:
                deadline.append(time.monotonic() + rng.uniform(0.0, 0.2))
            return time.monotonic() >= deadline[0]

        end = time.monotonic() + 120
        while proc.poll() is None and not after_a_save() and time.monotonic() < end:
            time.sleep(0.001)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code and "Traceback" not in err, err
        assert f"foxhunt: {said} at env step" in err, err
        assert f"checkpoint saved: continue with `foxhunt resume {run_dir}`" in err, err
    done = subprocess.run(
        cli("resume", str(run_dir), "--no-progress"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert_same_run(reference.done(), run_dir)


@pytest.mark.parametrize("signum,code,said", STOPS)
def test_ctrl_c_with_async_env_workers_stops_cleanly(
    tmp_path: Path, signum: int, code: int, said: str
) -> None:
    """Ctrl-C, Slurm's or systemd's SIGTERM and a closed terminal's SIGHUP reach the whole
    process group, async env workers included: they ignore it, so the trainer saves its
    checkpoint and closes them (a worker dying first broke the pipe and the CLI said "error:
    Broken pipe", exit 2, for SIGTERM), and nothing prints a worker's traceback."""
    run_dir = tmp_path / "async"
    args = train_args(run_dir)
    args[args.index(str(TOTAL))] = "100000"
    args += ["--set", "vector_env=async", "--set", "n_envs=2"]
    proc = subprocess.Popen(
        cli(*args), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as a terminal gives it
    )  # fmt: skip
    end = time.monotonic() + 120
    while proc.poll() is None and not latest_step(run_dir) and time.monotonic() < end:
        time.sleep(0.01)
    os.killpg(proc.pid, signum)  # what Ctrl-C in a terminal does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"foxhunt: {said} at env step" in err, err
    assert "checkpoint saved: continue with" in err and "Traceback" not in err, err
    assert "Broken pipe" not in err


def test_a_sighup_under_nohup_does_not_stop_the_run(tmp_path: Path) -> None:
    """nohup ignores SIGHUP so that a run outlives its terminal: foxhunt leaves it ignored."""
    run_dir = tmp_path / "nohup"
    hup = "import signal, sys, runpy; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    hup += "sys.argv = ['foxhunt', *sys.argv[1:]]; runpy.run_module('foxhunt', run_name='__main__')"
    args = train_args(run_dir)
    proc = subprocess.Popen(
        [sys.executable, "-c", hup, *args], env=env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    end = time.monotonic() + 120
    while proc.poll() is None and not latest_step(run_dir) and time.monotonic() < end:
        time.sleep(0.001)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert (run_dir / "model.safetensors").is_file()


def test_a_closed_stdout_stops_the_printing_not_the_run(tmp_path: Path) -> None:
    """`foxhunt train | head -1`, or a log reader (tee) that died: rich turned the broken pipe
    into SystemExit(1), and the run ended silently with no checkpoint and no model."""
    run_dir = tmp_path / "piped"
    args = [a for a in train_args(run_dir) if a != "--no-progress"]  # progress lines to write
    proc = subprocess.Popen(
        cli(*args), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("foxhunt: run ")
    proc.stdout.close()  # what `head -1` does after its line
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "stdout is closed (Broken pipe): foxhunt prints nothing more there" in err
    assert (run_dir / "model.safetensors").is_file() and (run_dir / "summary.json").is_file()


def test_a_name_stdout_cannot_encode_is_escaped(tmp_path: Path) -> None:
    """A run directory named in Cyrillic on an ASCII stdout (a redirected Windows console is
    cp1252): print() raised UnicodeEncodeError with a traceback, leaving a half-made run."""
    run_dir = tmp_path / "ран €"
    done = subprocess.run(
        cli(*train_args(run_dir)),
        env={**env(), "PYTHONIOENCODING": "ascii"},
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode("ascii")  # raises if a character is not ASCII
    assert "\\u0440\\u0430\\u043d \\u20ac" in out
    assert (run_dir / "model.safetensors").is_file()


def test_a_stop_during_the_final_save_is_finished_by_resume(tmp_path: Path, monkeypatch) -> None:
    """The final checkpoint is written before the model: a run stopped between the two (a
    crash, a stop signal during the save) has finished training. `foxhunt resume` used to call
    it complete and `evaluate` unfinished, so nothing could finish it; resume now writes the
    model from the checkpoint, the one an uninterrupted run writes. So does an extension
    (`resume --total-steps`) stopped before its first checkpoint: config.yaml's total holds."""
    import json

    import foxhunt.session as session
    from foxhunt.runs import build_spec

    overrides = {"eval_interval": 400, "eval_episodes": 2, "checkpoint_interval": 400}
    spec = build_spec(env="CartPole-v1", total_steps=800, overrides=overrides, seed=3)
    session.run_training(spec, tmp_path / "straight", progress=False)

    class Stop(Exception):
        pass

    def stop(*args: object, **kwargs: object) -> None:
        raise Stop

    with monkeypatch.context() as m:
        m.setattr(session, "save_model", stop)
        with pytest.raises(Stop):
            session.run_training(spec, tmp_path / "stopped", progress=False)
    stopped = tmp_path / "stopped"
    assert not (stopped / "model.json").exists() and (stopped / "checkpoints").is_dir()
    summary = session.resume_training(stopped, progress=False)
    assert summary["env_steps"] == 800
    for name in ("model.safetensors", "best_model.safetensors"):
        done, reference = (load_file(str(d / name)) for d in (stopped, tmp_path / "straight"))
        assert done.keys() == reference.keys()
        assert all(torch.equal(done[k], reference[k]) for k in done), name
    kept = json.loads((stopped / "summary.json").read_text())
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())
    for key in ("env_steps", "optimizer_steps", "episodes", "best_eval_return", "health"):
        assert kept[key] == straight[key], key
    with pytest.raises(session.FoxhuntError, match="is complete at 800 env steps"):
        session.resume_training(stopped, progress=False)

    # An extension stopped before its first checkpoint: a plain resume finishes it.
    with monkeypatch.context() as m:
        m.setattr(session, "_train_loop", lambda *a, **k: (_ for _ in ()).throw(Stop()))
        with pytest.raises(Stop):
            session.resume_training(stopped, total_steps=1200, progress=False)
    assert "total_env_steps: 1200" in (stopped / "config.yaml").read_text()
    assert session.resume_training(stopped, progress=False)["env_steps"] == 1200


def test_resume_says_when_metrics_rows_before_the_checkpoint_are_lost(
    tmp_path: Path, caplog
) -> None:
    import foxhunt.session as session
    from foxhunt.runs import build_spec

    overrides = {"eval_interval": 0, "checkpoint_interval": 400, "log_interval": 100}
    spec = build_spec(env="CartPole-v1", total_steps=800, overrides=overrides, seed=3)
    run = tmp_path / "run"
    session.run_training(spec, run, progress=False)
    session.resume_training(run, total_steps=900, progress=False)  # whole file: nothing said
    assert "rows in between are lost" not in caplog.text
    metrics = run / "metrics.csv"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:4]))  # to 300
    session.resume_training(run, total_steps=1000, progress=False)
    assert "ends at env step 300, but the run logged up to env step 900" in caplog.text
    caplog.clear()
    metrics.unlink()
    session.resume_training(run, total_steps=1100, progress=False)
    assert "ends at env step 0, but the run logged up to env step 1000" in caplog.text


def test_a_model_behind_the_latest_checkpoint_is_said_and_resume_catches_up(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """`resume --total-steps` stopped after training on: evaluate's model is the shorter run's
    (said), and a plain resume writes the longer run's."""
    import json

    import foxhunt
    import foxhunt.session as session
    from foxhunt.runs import build_spec

    overrides = {"eval_interval": 0, "checkpoint_interval": 400}
    spec = build_spec(env="CartPole-v1", total_steps=400, overrides=overrides, seed=5)
    run = tmp_path / "run"
    session.run_training(spec, run, progress=False)
    foxhunt.load_model(run)
    assert "past its model" not in caplog.text

    def stop(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(session, "save_model", stop)
        with pytest.raises(KeyboardInterrupt):
            session.resume_training(run, total_steps=800, progress=False)
    foxhunt.load_model(run)
    assert "latest checkpoint (env step 800) is past its model (env step 400)" in caplog.text
    assert session.resume_training(run, progress=False)["env_steps"] == 800
    assert json.loads((run / "summary.json").read_text())["env_steps"] == 800


def test_an_interrupted_run_is_evaluated_with_its_latest_checkpoint(
    tmp_path: Path, monkeypatch
) -> None:
    """A run stopped part way has no model until it is resumed; `--model latest` (load_model
    "latest") gives its latest checkpoint's policy, and on a finished run that policy is the
    final model's, action for action."""
    import signal as sig

    import numpy as np

    import foxhunt
    import foxhunt.session as session
    from foxhunt.errors import FoxhuntError
    from foxhunt.runs import build_spec
    from foxhunt.trainer import DQNTrainer, TrainingInterrupted

    overrides = {"eval_interval": 0, "checkpoint_interval": 300, "learning_starts": 200}
    spec = build_spec(env="CartPole-v1", total_steps=900, overrides=overrides, seed=2)
    done = tmp_path / "done"
    session.run_training(spec, done, progress=False)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    final, latest = foxhunt.load_model(done), foxhunt.load_model(done, "latest")
    np.testing.assert_array_equal(final.predict(obs), latest.predict(obs))

    collect = DQNTrainer.collect_step

    def interrupt(self: DQNTrainer) -> None:
        collect(self)
        if self.env_steps == 600:
            self._interrupt_requested = sig.SIGINT  # as the Ctrl-C handler sets it

    monkeypatch.setattr(DQNTrainer, "collect_step", interrupt)
    stopped = tmp_path / "stopped"
    with pytest.raises(TrainingInterrupted):
        session.run_training(spec, stopped, progress=False)
    monkeypatch.setattr(DQNTrainer, "collect_step", collect)
    with pytest.raises(FoxhuntError, match="--model latest takes its latest checkpoint"):
        foxhunt.load_model(stopped)
    agent = foxhunt.load_model(stopped, "latest")
    assert agent.optimizer_steps > 0 and agent.predict(obs).shape == (64,)
    out = session.evaluate_run(stopped, episodes=2, model="latest")
    assert out["model"] == "latest" and (stopped / "evaluation_latest.json").is_file()


@pytest.mark.parametrize("which", ["final", "best", "latest"])
def test_loading_a_model_from_no_run_directory_says_so(tmp_path: Path, which: str) -> None:
    import foxhunt

    # A mistyped path was said to be "a run directory with no trained model".
    with pytest.raises(FoxhuntError, match=f"^{re.escape(str(tmp_path / 'nothere'))}: run "):
        foxhunt.load_model(tmp_path / "nothere", which)
    (tmp_path / "model.json").write_text("{}")
    with pytest.raises(FoxhuntError, match=r"model\.json: is a file, not a run directory"):
        foxhunt.load_model(tmp_path / "model.json", which)


def test_an_extension_of_an_unfinished_run_is_not_dropped(tmp_path: Path, monkeypatch) -> None:
    """Stopped at 600 of 900, then `resume --total-steps 1500` stopped before its first
    checkpoint: a plain resume goes on to the 1500 config.yaml asks for, not back to 900."""
    import signal as sig

    import foxhunt.session as session
    from foxhunt.runs import build_spec
    from foxhunt.trainer import DQNTrainer, TrainingInterrupted

    overrides = {"eval_interval": 0, "checkpoint_interval": 300, "learning_starts": 200}
    spec = build_spec(env="CartPole-v1", total_steps=900, overrides=overrides, seed=4)
    collect = DQNTrainer.collect_step

    def interrupt(self: DQNTrainer) -> None:
        collect(self)
        if self.env_steps == 600:
            self._interrupt_requested = sig.SIGINT

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(DQNTrainer, "collect_step", interrupt)
        with pytest.raises(TrainingInterrupted):
            session.run_training(spec, run, progress=False)

    class Stop(Exception):
        pass

    with monkeypatch.context() as m:
        m.setattr(session, "_train_loop", lambda *a, **k: (_ for _ in ()).throw(Stop()))
        with pytest.raises(Stop):
            session.resume_training(run, total_steps=1500, progress=False)
    assert session.resume_training(run, progress=False)["env_steps"] == 1500
    assert "total_env_steps: 1500" in (run / "config.yaml").read_text()


def test_a_checkpoint_skipped_for_a_foreign_file_stops_the_resume_before_it_trains(
    tmp_path: Path, caplog
) -> None:
    """The newest checkpoint holding another file was skipped for an older one; the resume then
    trained, could not replace that directory, and stopped with metrics.csv cut back. A file
    browser's .DS_Store is no such file."""
    import foxhunt.session as session
    from foxhunt.errors import CheckpointError
    from foxhunt.runs import build_spec

    overrides = {"eval_interval": 0, "checkpoint_interval": 300, "learning_starts": 200}
    spec = build_spec(env="CartPole-v1", total_steps=600, overrides=overrides, seed=6)
    run = tmp_path / "run"
    session.run_training(spec, run, progress=False)
    newest = run / "checkpoints" / "step-000000000600"
    (newest / ".DS_Store").write_bytes(b"\0")
    (newest / "notes.txt").write_text("mine")
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=r"step-000000000600 holds 'notes.txt', which no"):
        session.resume_run(run, total_steps=900, progress=False)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files  # untouched
    (newest / "notes.txt").unlink()
    # A file where the resumed run will save blocks too (step 900: the end); one at a step it
    # never saves at, or past its total, does not (a planted pickle there is skipped).
    from foxhunt.checkpoint import CheckpointManager

    stray = run / "checkpoints" / "step-000000000900"
    stray.write_text("x")
    assert CheckpointManager(run).blocked({600, 900}) == [(stray, [])]
    assert CheckpointManager(run).blocked({600, 850}) == []
    with pytest.raises(CheckpointError, match=r"step-000000000900 is a file or a link"):
        session.resume_run(run, total_steps=900, progress=False)
    stray.unlink()
    caplog.clear()
    session.resume_run(run, total_steps=900, progress=False)  # from step 600, as it should
    assert "unexpected file" not in caplog.text
    assert (run / "checkpoints" / "step-000000000900").is_dir()
