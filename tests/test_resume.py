"""Exact resume: an interrupted run continued in a new process equals the uninterrupted run.

The comparison is made fair by construction. Epsilon and PER beta are annealed over
``total_env_steps``, so both runs must know the same total from the first step: the straight run
trains ``2k`` steps with ``checkpoint_interval=k``, and the interrupted run is that run directory
rolled back to its step-``k`` checkpoint (later checkpoints, ``latest.json``, final model and
summary deleted; metrics rows after ``k`` left in place for the resume to trim). ``foxhunt resume``
then continues it to ``2k`` in a fresh process, which must reproduce the straight run bit for bit:
every tensor of the final (and best-evaluation) weights, and every metrics.csv cell except the
wall-clock columns. Training ``k`` steps with ``--total-steps k`` would anneal the schedules over
``k`` instead of ``2k`` and could not be compared.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import TINY_CARTPOLE
from safetensors.torch import load_file

from foxhunt.logging import METRIC_COLUMNS, WALL_CLOCK_COLUMNS

SRC = Path(__file__).resolve().parents[1] / "src"
K = 600  # checkpoint step; both runs train 2K env steps

# Tiny CartPole config: a run takes ~1 s after imports on one thread.
TINY = {
    **TINY_CARTPOLE,
    "eval_interval": 400,
    "eval_episodes": 2,
    "torch_threads": 1,
    "device": "cpu",
    "keep_checkpoints": 5,
    "checkpoint_interval": K,
    # Rainbow parts whose state must survive a resume: sum tree, partial n-step returns and
    # the noise generator.
    "prioritized_replay": "true",
    "n_step": 3,
    "noisy_nets": "true",
}
SUMMARY_WALL_CLOCK = {"wall_time_s", "eval_time_s", "env_steps_per_s", "updates_per_s"}


def foxhunt(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a new process (with this checkout's sources)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "foxhunt.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def sets(overrides: dict[str, object]) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]


def metrics(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv rows without the wall-clock columns (cells compared as written)."""
    with open(run_dir / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_COLUMNS} for r in rows]


def assert_same_weights(a: Path, b: Path) -> int:
    """Bitwise-equal tensors in two safetensors files; returns the number of tensors."""
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    for key in ta:
        assert ta[key].dtype == tb[key].dtype and torch.equal(ta[key], tb[key]), key
    return len(ta)


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param({}, id="per-nstep3-noisy"),
        # Accumulation samples the effective batch once and splits it; two envs also put two
        # partial n-step queues and two env states into the checkpoint.
        pytest.param({"gradient_accumulation_steps": 2, "n_envs": 2}, id="accum2-envs2"),
        # The default agent: the trading env (random-start episodes, positions, equity) and the
        # regime-conditional network; the checkpoint falls mid-episode.
        pytest.param({"env": None, "n_envs": 2}, id="trading"),
        # Toy text: a Discrete observation (one-hot encoded) and state kept in ``s``.
        pytest.param({"env": "FrozenLake-v1"}, id="frozenlake"),
        # Classic control whose state changes kind between reset and step (MountainCar: an array,
        # then a tuple; Acrobot: float32, then float64): a mid-episode checkpoint was refused.
        pytest.param({"env": "MountainCar-v0"}, id="mountaincar"),
        pytest.param({"env": "Acrobot-v1"}, id="acrobot"),
        # compile with Adam: every update is the one-graph whole step, recompiled by the resume.
        pytest.param({"compile": "true", "optimizer": "adam"}, id="compiled-whole-step"),
        # A linear decay over the run (lr_decay_steps null): its length is planned from the
        # total, again in the resuming process.
        pytest.param({"lr_schedule": "linear", "lr_final_ratio": 0.1}, id="lr-decay-over-run"),
    ],
)
def test_resume_in_new_process_is_bitwise_exact(tmp_path: Path, variant: dict) -> None:
    straight = tmp_path / "straight"
    variant = dict(variant)
    env = variant.pop("env", "CartPole-v1")
    args = ["--total-steps", str(2 * K), "--seed", "5", "--no-progress"]
    args += ["--env", env] if env else []
    done = foxhunt(
        "train", *args, "--run-dir", str(straight), *sets({**TINY, **variant}), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    ckpts = straight / "checkpoints"
    assert (ckpts / f"step-{K:012d}").is_dir() and (ckpts / f"step-{2 * K:012d}").is_dir()

    # Roll a copy back to step K, as if the process had stopped right after that save.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / f"step-{2 * K:012d}")
    (resumed / "checkpoints" / "latest.json").unlink()
    for name in ("model.safetensors", "best_model.safetensors", "summary.json"):
        (resumed / name).unlink(missing_ok=True)
    rows_before = metrics(resumed)
    assert int(rows_before[-1]["env_steps"]) == 2 * K  # rows past K: the resume must trim them

    out = foxhunt("resume", str(resumed), "--total-steps", str(2 * K), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # It really continued from the checkpoint (a rerun from scratch would also match).
    assert f"from step-{K:012d} at env step {K}" in out.stdout

    n = assert_same_weights(straight / "model.safetensors", resumed / "model.safetensors")
    assert n >= 6
    assert (straight / "best_model.safetensors").is_file()
    assert_same_weights(straight / "best_model.safetensors", resumed / "best_model.safetensors")
    a, b = metrics(straight), metrics(resumed)
    assert len(a) == 2 * K // 100 and list(a[0]) == [
        c for c in METRIC_COLUMNS if c not in WALL_CLOCK_COLUMNS
    ]
    assert a == b
    assert any(r["eval_return"] for r in a[K // 100 :])  # evaluations after the resume compared
    assert any(r["loss"] for r in a[K // 100 :])
    sa = json.loads((straight / "summary.json").read_text())
    sb = json.loads((resumed / "summary.json").read_text())
    # compile: true with Adam and one micro-batch: both processes ran the one-graph step.
    compiled = (
        variant.get("compile") == "true" and variant.get("gradient_accumulation_steps", 1) == 1
    )
    assert sa["learner_path"] == ("whole_step_graph" if compiled else "eager")
    assert {k: v for k, v in sa.items() if k not in SUMMARY_WALL_CLOCK} == {
        k: v for k, v in sb.items() if k not in SUMMARY_WALL_CLOCK
    }
    # The step-2K checkpoint written by the resumed process equals the straight run's too.
    from foxhunt.checkpoint import load_checkpoint

    t1, s1 = load_checkpoint(ckpts / f"step-{2 * K:012d}")
    t2, s2 = load_checkpoint(resumed / "checkpoints" / f"step-{2 * K:012d}")
    assert s1 == s2
    assert t1.keys() == t2.keys() and all(torch.equal(t1[k], t2[k]) for k in t1)


def test_refused_checkpoint_leaves_a_trained_trainer_bit_for_bit_unchanged() -> None:
    """restore_state is all or nothing, even when the bad part is loaded after good parts.

    The forged checkpoint holds different network, optimizer and RNG states (step 300) but a
    replay tensor of the wrong shape, which only the replay loader notices - after the network
    was already overwritten. The trainer (at step 500) must come back exactly as it was.
    """
    from foxhunt.config import DQNHyperparameters
    from foxhunt.errors import CheckpointError
    from foxhunt.trainer import DQNTrainer
    from foxhunt.trainstate import capture_state, restore_state

    torch.set_num_threads(1)
    hp = DQNHyperparameters(
        hidden_sizes=(32, 32),
        learning_starts=64,
        batch_size=32,
        buffer_capacity=1000,
        train_freq=4,
        log_interval=100,
        eval_interval=0,
        device="cpu",
        prioritized_replay=True,
        n_step=3,
        noisy_nets=True,
        seed=2,
    )
    trainer = DQNTrainer(hp, "CartPole-v1")
    try:
        trainer.learn(300)
        captured, old_state = capture_state(trainer)
        old_tensors = {k: v.clone() for k, v in captured.items()}  # captured tensors are views
        trainer.learn(500)
        live, now_state = capture_state(trainer)
        now_tensors = {k: v.clone() for k, v in live.items()}
        key = next(k for k in now_tensors if k.startswith("online."))
        assert not torch.equal(old_tensors[key], now_tensors[key])  # the forgery would change it
        forged = dict(old_tensors)
        forged["replay.obs"] = forged["replay.obs"][:, :2].contiguous()
        with pytest.raises(CheckpointError, match="replay"):
            restore_state(trainer, forged, old_state)
        after_tensors, after_state = capture_state(trainer)
        assert after_state == now_state
        assert after_tensors.keys() == now_tensors.keys()
        assert all(torch.equal(after_tensors[k], now_tensors[k]) for k in now_tensors)
        # And the untouched trainer still trains.
        trainer.learn(600)
        assert trainer.env_steps == 600
    finally:
        trainer.close()


def _small_cartpole_trainer() -> Any:
    """A one-hidden-layer CartPole trainer that starts learning after 32 env steps."""
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    torch.set_num_threads(1)
    hp = DQNHyperparameters(
        hidden_sizes=(8,), learning_starts=32, batch_size=32, eval_interval=0, device="cpu"
    )
    return DQNTrainer(hp, "CartPole-v1")


def _trained_and_captured() -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
    """A small trainer after 64 env steps, and its captured state (tensors cloned)."""
    from foxhunt.trainstate import capture_state

    trainer = _small_cartpole_trainer()
    trainer.learn(64)
    tensors, state = capture_state(trainer)
    return trainer, {k: v.clone() for k, v in tensors.items()}, state


def test_restore_puts_back_torch_global_random_state() -> None:
    """foxhunt draws nothing from torch's global generator, but a user's env or wrapper may:
    a resume must continue its stream where the checkpoint left it."""
    from foxhunt.trainstate import restore_state

    trainer, tensors, state = _trained_and_captured()
    try:
        expected = torch.rand(8)  # the draws the straight run makes next
        restore_state(trainer, tensors, state)
        assert torch.equal(torch.get_rng_state(), tensors["rng.torch"])
        assert torch.equal(torch.rand(8), expected)
    finally:
        trainer.close()


def test_checkpoint_without_a_newer_hyperparameter_resumes_at_its_default() -> None:
    """A checkpoint written before a field existed resumes when the run keeps that field's
    default; a non-default value still refuses it."""
    import json

    from foxhunt.errors import CheckpointError
    from foxhunt.trainstate import capture_state, restore_state

    trainer, tensors, state = _trained_and_captured()
    try:
        old = json.loads(json.dumps(state))
        del old["hyperparameters"]["action_augmentation"]  # as written before the field existed
        restore_state(trainer, tensors, old)
        assert capture_state(trainer)[1] == state
        old["hyperparameters"]["n_step"] = 3
        with pytest.raises(CheckpointError, match="n_step=3 in the checkpoint, 1 in the run"):
            restore_state(trainer, tensors, old)
    finally:
        trainer.close()


def test_checkpoint_without_newer_state_fields_resumes_with_their_defaults() -> None:
    """Fields the trainer's state gained after checkpoints were first written: the loader's
    defaults for them (every update stepped, no divergence run, no learner path yet) must get
    past the round-trip check too; ``loop.window.stepped`` did not (refused as missing). A
    field with no default is refused by name, not as a KeyError inside the health monitor."""
    import json

    from foxhunt.errors import CheckpointError
    from foxhunt.trainer import DQNTrainer
    from foxhunt.trainstate import capture_state, restore_state

    class Capture:  # the periodic checkpoint at step 64, taken inside an open metrics window
        def save(self, trainer: Any) -> Path:
            if trainer.env_steps != 64:  # the end of learn() saves too, after its last row
                return Path("not captured")
            self.tensors, self.state = capture_state(trainer)
            self.tensors = {k: v.clone() for k, v in self.tensors.items()}
            return Path("captured")

    torch.set_num_threads(1)
    hp = {"hidden_sizes": (8,), "learning_starts": 16, "batch_size": 16, "eval_interval": 0}
    trainer = DQNTrainer(
        {**hp, "log_interval": 10_000, "checkpoint_interval": 64, "device": "cpu"}, "CartPole-v1"
    )
    try:
        trainer._checkpointer = capture = Capture()
        trainer.learn(96)
        tensors, state = capture.tensors, capture.state
        old = json.loads(json.dumps(state))
        del old["loop"]["window"]["stepped"], old["agent"]["learner_path"]
        del old["health"]["initial_q_abs_max"], old["health"]["divergent_run"]
        restore_state(trainer, tensors, old)
        window = capture_state(trainer)[1]["loop"]["window"]
        assert window["stepped"] == window["updates"] == state["loop"]["window"]["updates"] > 0
        del old["health"]["max_abs_reward"]
        with pytest.raises(CheckpointError, match=r"health\.max_abs_reward is missing"):
            restore_state(trainer, tensors, old)
    finally:
        trainer.close()


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop", "sgd"])
def test_loop_boundaries_optimizer_state_and_rates_are_checked_against_the_run(
    optimizer: str,
) -> None:
    """Fields a forger (or a bug) could set apart from the hyperparameters, each of which loaded:
    an evaluation boundary with evaluation off (the loop spun for ever), none with it on (no
    evaluation again), a checkpoint boundary off its interval, an optimizer state missing a
    buffer (a KeyError at the first update), a learning rate other than learning_rate."""
    import json

    from foxhunt.config import DQNHyperparameters
    from foxhunt.errors import CheckpointError
    from foxhunt.trainer import DQNTrainer
    from foxhunt.trainstate import capture_state, restore_state

    torch.set_num_threads(1)
    hp = DQNHyperparameters(
        hidden_sizes=(8,),
        learning_starts=32,
        batch_size=32,
        n_envs=4,
        eval_interval=24,
        eval_episodes=1,
        checkpoint_interval=3,  # under n_envs: the boundary lags behind the steps, by design
        optimizer=optimizer,
        lr_schedule="cosine",
        momentum=0.9 if optimizer == "sgd" else 0.0,  # SGD keeps no state without it
        device="cpu",
    )
    trainer = DQNTrainer(hp, "CartPole-v1")
    try:
        trainer.learn(64)
        tensors, state = capture_state(trainer)
        tensors = {k: v.clone() for k, v in tensors.items()}
        assert state["loop"]["next_ckpt"] <= state["loop"]["env_steps"]  # the lag, accepted:
        restore_state(trainer, tensors, json.loads(json.dumps(state)))
        assert capture_state(trainer)[1] == state
        buffers = sorted({k.split(".", 2)[2] for k in tensors if k.startswith("optim.")})
        assert buffers, "the optimizer holds state after 64 steps"
        forgeries = [
            ("loop", "next_eval", None, "loop.next_eval must be a multiple of 24 after 64"),
            ("loop", "next_eval", 48, "loop.next_eval must be a multiple of 24 after 64"),
            ("loop", "next_eval", 100, "loop.next_eval must be a multiple of 24"),
            ("loop", "next_ckpt", None, "loop.next_ckpt must be a multiple of 3"),
            ("loop", "next_ckpt", 65, "loop.next_ckpt must be a multiple of 3"),
            ("scheduler", "base_lrs", [10.0], "scheduler.base_lrs must be"),
            ("scheduler", "_last_lr", [10.0], "must be the scheduler's last rate"),
        ]
        for section, key, value, message in forgeries:
            forged = json.loads(json.dumps(state))
            forged[section][key] = value
            with pytest.raises(CheckpointError, match=re.escape(message)):
                restore_state(trainer, tensors, forged)
        for buffer in buffers:  # gone from every parameter: nothing to compare with but the kind
            partial = {k: v for k, v in tensors.items() if not k.endswith(f".{buffer}")}
            with pytest.raises(
                CheckpointError, match=r"state of parameter 0 holds|n_state must count the 0"
            ):
                restore_state(trainer, partial, state)
        assert capture_state(trainer)[1] == state  # every refusal left the trainer as it was
    finally:
        trainer.close()


def test_how_the_learner_ran_survives_a_resume_that_takes_no_step() -> None:
    """summary.json's learner_path: a resume whose remaining steps hold no update (or that only
    writes the final model) reported null where the uninterrupted run said "eager"."""
    import json

    from foxhunt.errors import CheckpointError
    from foxhunt.trainstate import restore_state

    trainer, tensors, state = _trained_and_captured()
    trainer.close()
    assert state["agent"]["learner_path"] == "eager"
    fresh = _small_cartpole_trainer()
    try:
        assert fresh.agent.learner_path is None
        old = json.loads(json.dumps(state))
        del old["agent"]["learner_path"]  # as written before it was kept: null, as before
        restore_state(fresh, tensors, old)
        assert fresh.agent.learner_path is None
        restore_state(fresh, tensors, state)
        assert fresh.summary()["learner_path"] == "eager"
        old["agent"]["learner_path"] = "warp_drive"
        with pytest.raises(CheckpointError, match=r"agent\.learner_path must be null or one of"):
            restore_state(fresh, tensors, old)
    finally:
        fresh.close()


def test_checkpoint_without_newer_health_counters_resumes() -> None:
    """Health counters added later (the Q floor, the divergent-run count) start where a fresh
    run's do when a checkpoint predates them; a value that is no count is refused."""
    import json

    from foxhunt.errors import CheckpointError
    from foxhunt.trainstate import restore_state

    trainer, tensors, state = _trained_and_captured()
    try:
        old = json.loads(json.dumps(state))
        del old["health"]["divergent_run"], old["health"]["initial_q_abs_max"]
        restore_state(trainer, tensors, old)
        assert trainer.health.divergent_run == 0 and trainer.health.initial_q_abs_max is None
        old["health"]["divergent_run"] = -1
        with pytest.raises(CheckpointError, match=r"health\.divergent_run"):
            restore_state(trainer, tensors, old)
    finally:
        trainer.close()


def test_checkpoints_hold_nn_linear_layout_for_an_input_major_first_layer() -> None:
    """CartPole's 4 inputs make the first layer input-major (InputMajorLinear). Checkpoints hold
    its weight and Adam state in nn.Linear's [out, in] layout, as checkpoints written before that
    layout existed do, and a restore puts them back in the parameter's own storage layout (the
    fused Adam kernel reads parameter and state as flat memory, so they must match)."""
    from foxhunt.networks import InputMajorLinear
    from foxhunt.trainstate import capture_state, restore_state

    trainer = _small_cartpole_trainer()
    try:
        trainer.learn(96)
        first = trainer.agent.online_net.torso[0]
        assert isinstance(first, InputMajorLinear) and first.weight_t.shape == (4, 8)
        idx = next(i for i, p in enumerate(trainer.agent.params) if p is first.weight_t)
        live = trainer.agent.optimizer.state[first.weight_t]
        tensors, state = capture_state(trainer)
        tensors = {k: v.clone() for k, v in tensors.items()}
        assert tensors["online.torso.0.weight"].shape == (8, 4)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(tensors[f"optim.{idx}.{key}"], live[key].t())
        expected = {k: v.clone() for k, v in live.items() if torch.is_tensor(v)}
        trainer.learn(160)  # move on, then go back
        restore_state(trainer, tensors, state)
        restored = trainer.agent.optimizer.state[first.weight_t]
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(restored[key], expected[key]) and restored[key].is_contiguous()
        assert capture_state(trainer)[1] == state
        trainer.learn(192)  # and the restored state trains
    finally:
        trainer.close()


def test_a_new_total_that_moves_the_schedules_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """resume --total-steps N stretches epsilon (and PER beta) to the new total: the resumed
    run is then not the continuation of the old schedule, and the log says how it moves."""
    from foxhunt.config import DQNHyperparameters
    from foxhunt.session import _warn_schedule_change
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters(
        hidden_sizes=(8,),
        exploration_fraction=0.9,
        prioritized_replay=True,
        lr_schedule="cosine",  # over the run (lr_decay_steps None): it follows the total too
        learning_starts=100,
        device="cpu",
    )
    trainer = DQNTrainer(hp, "CartPole-v1")
    try:
        trainer.env_steps, trainer.total_env_steps = 400, 400
        _warn_schedule_change(trainer, 400)
        assert caplog.text == ""
        _warn_schedule_change(trainer, 600)
        assert "epsilon follows the new total of 600 env steps (was 400)" in caplog.text
        assert "from 0.05 to 0.2963" in caplog.text and "PER beta follows" in caplog.text
        assert (
            "the learning rate's cosine decay follows the new total of 600 env steps (was "
            in (caplog.text)
            and "it ends at optimizer step 126 (was 76; 0 taken)" in caplog.text
        )
        caplog.clear()
        with warnings.catch_warnings():  # (stepped without an optimizer step)
            warnings.simplefilter("ignore")
            for _ in range(70):  # the schedule 70 steps on: the new total raises its rate
                trainer.agent.scheduler.step()
        _warn_schedule_change(trainer, 600)
        assert "the next step's rate goes from 0.0001098 to 0.0004657" in caplog.text
        assert trainer.total_env_steps == 400  # only asked, not changed
    finally:
        trainer.close()
