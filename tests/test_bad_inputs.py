"""Every bad input is refused the same way: exit code 2, one stderr line naming the field or file
and the value, no traceback, nothing left behind.

The table covers hyperparameters, CLI arguments, market-data files and checkpoints. Most rows run
``foxhunt.cli.main`` in a forked child of a server process that imported foxhunt once: each row
still gets its own process, exit status and stdout/stderr files, exactly as the console script
(``sys.exit(main())``) would, without paying the ~2 s torch import 50 times. A few rows also run
the real ``python -m foxhunt.cli`` to show both agree.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _helpers import ForkedCli, Result, cli_env

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> ForkedCli:
    server = ForkedCli(tmp_path_factory.mktemp("cli-io"))
    yield server  # type: ignore[misc]
    server.close()


def real_cli(*argv: str, cwd: Path) -> Result:
    done = subprocess.run(
        [sys.executable, "-m", "foxhunt.cli", *argv],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def assert_user_error(res: Result, *must: str) -> str:
    """Exit 2, exactly one stderr line containing every ``must``, nothing on stdout."""
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert res.code == 2, (res.code, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and res.stderr.endswith("\n"), res.stderr
    assert lines[0].startswith("foxhunt: error: "), lines[0]
    for part in must:
        assert part in lines[0], (part, lines[0])
    assert res.stdout == "", res.stdout
    return lines[0]


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (names relative), to prove nothing changed."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --- inputs ---------------------------------------------------------------------------------------
TINY = [
    "--set",
    "hidden_sizes=[32,32]",
    "--set",
    "learning_starts=64",
    "--set",
    "batch_size=32",
    "--set",
    "eval_interval=0",
    "--set",
    "log_interval=100",
    "--set",
    "torch_threads=1",
    "--set",
    "buffer_capacity=1000",
    "--set",
    "gradient_accumulation_steps=1",  # presets may accumulate; these rows need a valid config
    "--no-progress",
]
GYM = ["train", "--env", "CartPole-v1", "--total-steps", "300", "--run-dir", "run", *TINY]
TRADE = ["train", "--total-steps", "300", "--run-dir", "run", *TINY]


def write_ohlcv(path: Path, n: int = 300) -> pd.DataFrame:
    """A valid daily OHLCV file (random walk), written as CSV."""
    rng = np.random.default_rng(3)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    open_ = np.r_[close[0], close[:-1]]
    df = pd.DataFrame(
        {
            "timestamp": pd.date_range("2020-01-01", periods=n, freq="D").strftime("%Y-%m-%d"),
            "open": open_,
            "high": np.maximum(open_, close) * 1.01,
            "low": np.minimum(open_, close) * 0.99,
            "close": close,
            "volume": rng.uniform(1e5, 2e5, n),
        }
    )
    df.to_csv(path, index=False)
    return df


def make_data(root: Path) -> None:
    df = write_ohlcv(root / "good.csv")
    (root / "empty.csv").write_text("")
    d = df.copy()
    d.loc[10, "close"] = np.nan
    d.to_csv(root / "nan.csv", index=False)
    d = df.copy()
    d.loc[12, "high"] = d.loc[12, "low"] - 1.0
    d.to_csv(root / "hilo.csv", index=False)
    df.iloc[[*range(20, 0, -1), *range(21, len(df))]].to_csv(root / "unsorted.csv", index=False)
    d = df.astype({"close": object})
    d.loc[5, "close"] = "abc"
    d.to_csv(root / "text.csv", index=False)
    df.drop(columns=["close"]).to_csv(root / "noclose.csv", index=False)
    df.iloc[:20].to_csv(root / "few.csv", index=False)
    (root / "bad.yaml").write_text("gamma: [0.9, 0.99\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "value.yaml").write_text("hyperparameters:\n  gamma: 1.5\n")
    (root / "dup.yaml").write_text("hyperparameters:\n  gamma: 0.9\n  gamma: 0.5\n")
    (root / "flat-typo.yaml").write_text("gamma: 0.9\ntotal_env_step: 300\n")
    (root / "mp-off.yaml").write_text("hyperparameters:\n  mixed_precision: on\n")
    (root / "afile").write_text("not a directory\n")
    (root / "full").mkdir()
    (root / "full" / "keep.txt").write_text("user data\n")
    (root / "project" / "src").mkdir(parents=True)  # a project's own config.yaml: no run
    (root / "project" / "config.yaml").write_text("lr: 0.1\n")
    (root / "project" / "src" / "main.py").write_text("print('mine')\n")
    (root / "notarun").mkdir()


# (id, argv, substrings the one error line must contain)
ROWS: list[tuple[str, list[str], tuple[str, ...]]] = [
    # hyperparameters (--set and config files)
    ("gamma-2", [*GYM, "--set", "gamma=2"], ("gamma", "2")),
    ("gamma-text", [*GYM, "--set", "gamma=abc"], ("gamma", "'abc'")),
    ("lr-0", [*GYM, "--set", "learning_rate=0"], ("learning_rate", "0")),
    ("lr-nan", [*GYM, "--set", "learning_rate=nan"], ("learning_rate", "nan")),
    ("unknown-key", [*GYM, "--set", "warp_speed=9"], ("warp_speed", "9")),
    (
        "accum-0",
        [*GYM, "--set", "gradient_accumulation_steps=0"],
        ("gradient_accumulation_steps", "0"),
    ),
    (
        "accum-2.5",
        [*GYM, "--set", "gradient_accumulation_steps=2.5"],
        ("gradient_accumulation_steps", "2.5"),
    ),
    (
        "batch-over-buffer",
        [*GYM, "--set", "batch_size=512", "--set", "buffer_capacity=100"],
        ("buffer_capacity", "100", "512"),
    ),
    (
        "learning-starts-below-batch",
        [*GYM, "--set", "learning_starts=10"],
        ("learning_starts", "10"),
    ),
    ("optimizer", [*GYM, "--set", "optimizer=lion"], ("optimizer", "'lion'")),
    ("batch-bool", [*GYM, "--set", "batch_size=true"], ("batch_size", "True")),
    (
        "eps-order",
        [*GYM, "--set", "exploration_initial_eps=0.5", "--set", "exploration_final_eps=0.9"],
        ("exploration_final_eps", "0.9"),
    ),
    ("device", [*GYM, "--set", "device=tpu"], ("device", "'tpu'")),
    ("n-envs-0", [*GYM, "--set", "n_envs=0"], ("n_envs", "0")),
    ("set-no-equals", [*GYM, "--set", "gamma"], ("--set", "'gamma'")),
    ("dotted-unknown", [*GYM, "--set", "engine.turbo=1"], ("engine.turbo",)),
    ("trading-field", [*TRADE, "--set", "trading.fee=abc"], ("fee", "abc")),
    ("market-detector", [*TRADE, "--set", "market.detector=magic"], ("detector", "'magic'")),
    (
        "market-detector-regimes",
        [*TRADE, "--set", "market.detector=volatility_trend", "--set", "market.n_regimes=7"],
        ("market.n_regimes must be 3 or 4 with market.detector=volatility_trend", "got 7"),
    ),
    (
        "market-features-repeated",
        [*TRADE, "--set", "market.features=[ret_1,ret_1]"],
        ("market.features names 'ret_1' more than once",),
    ),
    ("config-missing", [*GYM, "--config", "nope.yaml"], ("config file", "nope.yaml")),
    ("config-invalid-yaml", [*GYM, "--config", "bad.yaml"], ("bad.yaml", "YAML")),
    ("config-list", [*GYM, "--config", "list.yaml"], ("list.yaml", "list")),
    ("config-bad-value", [*GYM, "--config", "value.yaml"], ("gamma", "1.5")),
    ("preset", [*GYM, "--preset", "turbo"], ("preset", "'turbo'")),
    ("lr-bool", [*GYM, "--set", "learning_rate=true"], ("learning_rate", "True")),
    ("tau-bool", [*GYM, "--set", "tau=true"], ("tau must be a number", "True")),
    ("trading-window-bool", [*TRADE, "--set", "trading.window=true"], ("trading.window", "True")),
    ("market-regimes-bool", [*TRADE, "--set", "market.n_regimes=true"], ("n_regimes", "True")),
    ("config-duplicate-key", [*GYM, "--config", "dup.yaml"], ("dup.yaml", "'gamma'", "line 3")),
    (
        "config-flat-unknown",
        [*GYM, "--config", "flat-typo.yaml"],
        ("flat-typo.yaml", "total_env_step"),
    ),
    ("config-yaml-on", [*GYM, "--config", "mp-off.yaml"], ("mixed_precision", "quote the value")),
    ("set-yaml-on", [*GYM, "--set", "vector_env=on"], ("vector_env", "True", "quote the value")),
    ("set-empty", [*GYM, "--set", "max_grad_norm="], ("max_grad_norm=null", "empty")),
    ("set-empty-data", [*TRADE, "--set", "market.data="], ("market.data=null", "empty")),
    ("set-bad-yaml", [*GYM, "--set", "hidden_sizes=[64,"], ("hidden_sizes", "'[64,'", "YAML")),
    # CLI arguments
    (
        "total-0",
        ["train", "--env", "CartPole-v1", "--total-steps", "0", "--run-dir", "run"],
        ("--total-steps", "0"),
    ),
    (
        "total-negative",
        ["train", "--env", "CartPole-v1", "--total-steps", "-5", "--run-dir", "run"],
        ("--total-steps", "-5"),
    ),
    (
        "total-text",
        ["train", "--env", "CartPole-v1", "--total-steps", "abc", "--run-dir", "run"],
        ("--total-steps", "'abc'"),
    ),
    ("seed-negative", [*GYM, "--seed", "-1"], ("--seed", "-1")),
    (
        "seed-huge",
        [*GYM, "--seed", "99999999999999999999999"],
        ("--seed must be less than 2**32", "99999999999999999999999"),
    ),
    ("env-unknown", [*GYM[:2], "NoSuchEnv-v9", *GYM[3:]], ("env", "'NoSuchEnv-v9'")),
    ("env-continuous", [*GYM[:2], "Pendulum-v1", *GYM[3:]], ("Discrete", "Box(")),
    ("env-with-data", [*GYM, "--data", "good.csv"], ("--data", "'CartPole-v1'")),
    ("command", ["fly"], ("'fly'",)),
    (
        "run-dir-is-file",
        [*GYM[: -len(TINY) - 2], "--run-dir", "afile", *TINY],
        ("--run-dir", "afile"),
    ),
    (
        "run-dir-not-empty",
        [*GYM[: -len(TINY) - 2], "--run-dir", "full", *TINY],
        ("--run-dir", "full"),
    ),
    (
        "force-on-a-non-run-dir",
        [*GYM[: -len(TINY) - 2], "--run-dir", "full", "--force", *TINY],
        ("--force replaces only a foxhunt run directory", "full"),
    ),
    (
        "force-on-a-project-with-a-config-yaml",
        [*GYM[: -len(TINY) - 2], "--run-dir", "project", "--force", *TINY],
        ("--force replaces only a foxhunt run directory", "project"),
    ),
    (
        "buffer-beyond-memory",  # 16 TB of replay: refused by the allocator on any machine
        [*GYM, "--set", "buffer_capacity=1000000000000"],
        ("out of memory", "buffer_capacity", "GiB"),
    ),
    (
        "buffer-past-int64",  # the size overflowed inside torch: a TypeError traceback
        [*GYM, "--set", "buffer_capacity=1000000000000000000000000000000"],
        ("out of memory", "buffer_capacity", "GiB"),
    ),
    (
        "alias-refers-to-itself",  # validating it recursed until a RecursionError
        [*GYM, "--set", "hidden_sizes=&a [*a]"],
        ("--set hidden_sizes", "alias"),
    ),
    ("set-env", [*GYM, "--set", "env=Acrobot-v1"], ("--set env='Acrobot-v1'", "--env")),
    (
        "max-episode-steps-negative",  # gym.make took it: a time limit that never ends
        [*GYM, "--set", "env_kwargs.max_episode_steps=-1"],
        ("env_kwargs.max_episode_steps", "-1"),
    ),
    (
        "synth-out-exists",
        ["data", "synth", "--out", "good.csv"],
        ("--out already exists", "good.csv"),
    ),
    ("resume-not-a-run", ["resume", "notarun"], ("config.yaml", "notarun")),
    ("resume-missing-dir", ["resume", "nowhere"], ("not found", "nowhere")),
    ("evaluate-missing-dir", ["evaluate", "nowhere"], ("not found", "nowhere")),
    ("evaluate-episodes-0", ["evaluate", "notarun", "--episodes", "0"], ("--episodes", "0")),
    ("report-no-metrics", ["report", "notarun"], ("metrics.csv", "notarun")),
    ("market-unknown-key", [*TRADE, "--set", "market.foo=1"], ("unknown setting", "'market.foo'")),
    (
        "trading-with-a-cnn",  # was told about regime_conditional, which the preset sets
        [*TRADE, "--set", "torso=cnn"],
        ("torso must be 'mlp' for observations of shape (", "got: 'cnn'"),
    ),
    ("trading-window-0", [*TRADE, "--set", "trading.window=0"], ("trading.window", "0")),
    (
        "no-validation-span",
        [*TRADE, "--set", "market.validation_fraction=0"],
        ("market.validation_fraction=0", "validation bars"),
    ),
    # market-data files (foxhunt.markets.data validation, on the trading path)
    ("data-missing", [*TRADE, "--data", "missing.csv"], ("--data", "missing.csv")),
    ("data-empty-path", [*TRADE, "--data", ""], ("--data must be a path, got an empty string",)),
    ("data-empty", [*TRADE, "--data", "empty.csv"], ("empty.csv", "empty")),
    ("data-nan", [*TRADE, "--data", "nan.csv"], ("nan.csv", "'close'", "nan")),
    ("data-high-below-low", [*TRADE, "--data", "hilo.csv"], ("hilo.csv", "'high'", "low")),
    ("data-unsorted", [*TRADE, "--data", "unsorted.csv"], ("unsorted.csv", "timestamp")),
    ("data-text", [*TRADE, "--data", "text.csv"], ("text.csv", "'close'", "'abc'")),
    ("data-no-close", [*TRADE, "--data", "noclose.csv"], ("noclose.csv", "close")),
    ("data-too-few-rows", [*TRADE, "--data", "few.csv"], ("few.csv", "20")),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    make_data(root)
    return root


@pytest.mark.parametrize(("argv", "must"), [pytest.param(a, m, id=i) for i, a, m in ROWS])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(
    cli: ForkedCli, inputs: Path, tmp_path: Path, argv: list[str], must: tuple[str, ...]
) -> None:
    for entry in inputs.iterdir():  # a private copy: nothing the CLI does can leak across rows
        (shutil.copytree if entry.is_dir() else shutil.copy)(entry, tmp_path / entry.name)
    before = snapshot(tmp_path)
    assert_user_error(cli(*argv, cwd=tmp_path), *must)
    assert not (tmp_path / "run").exists()  # no partial run directory
    assert snapshot(tmp_path) == before  # and no file created or changed anywhere


def test_the_real_console_entry_point_agrees(cli: ForkedCli, inputs: Path) -> None:
    """The forked rows behave like real processes: same exit code, same one line."""
    for argv in ([*TRADE, "--data", "hilo.csv"],):
        real, forked = real_cli(*argv, cwd=inputs), cli(*argv, cwd=inputs)
        assert_user_error(real)
        assert (real.code, real.stderr, real.stdout) == (forked.code, forked.stderr, forked.stdout)
        assert not (inputs / "run").exists()


# --- checkpoints ----------------------------------------------------------------------------------
CKPT = "checkpoints/step-000000000300"


@pytest.fixture(scope="module")
def trained(cli: ForkedCli, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 300-step run (PER + 3-step returns) with one checkpoint."""
    root = tmp_path_factory.mktemp("trained")
    res = cli(
        "train",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "300",
        "--run-dir",
        "run",
        "--set",
        "prioritized_replay=true",
        "--set",
        "n_step=3",
        *TINY,
        cwd=root,
    )
    assert res.code == 0, res.stderr
    return root / "run"


def rewrite(run: Path, edit: Callable[[dict, dict], None]) -> None:
    """Edit a checkpoint's state/tensors and re-hash the manifest, as a careful forger would:
    the integrity checks pass, so only validation of the content can refuse it."""
    from safetensors.torch import load_file, save_file

    ck = run / CKPT
    state = json.loads((ck / "state.json").read_text())
    tensors = load_file(str(ck / "tensors.safetensors"))
    edit(state, tensors)
    (ck / "state.json").write_text(json.dumps(state))
    save_file(tensors, str(ck / "tensors.safetensors"))
    manifest = json.loads((ck / "manifest.json").read_text())
    for name in ("state.json", "tensors.safetensors"):
        data = (ck / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest["tensors"] = {
        k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
        for k, v in tensors.items()
    }
    (ck / "manifest.json").write_text(json.dumps(manifest))


def flip_byte(path: Path, offset: int = -10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def _drop_replay_rewards(state: dict, tensors: dict) -> None:
    del tensors["replay.rewards"]


def _learning_rate_10(state: dict, tensors: dict) -> None:
    state["scheduler"].update(base_lrs=[10.0], _last_lr=[10.0])
    state["optimizer"]["param_groups"][0]["lr"] = 10.0


def _adam_step_as_a_number(state: dict, tensors: dict) -> None:
    tensors.pop("optim.0.step")
    state["optimizer"]["scalars"]["0"] = {"step": 3.0}


CHECKPOINT_ROWS: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = [
    (
        "tensors-bit-flip",
        lambda r: flip_byte(r / CKPT / "tensors.safetensors"),
        ("tensors.safetensors", "sha256"),
    ),
    (
        "tensors-truncated",
        lambda r: os.truncate(r / CKPT / "tensors.safetensors", 1000),
        ("tensors.safetensors", "1000 bytes"),
    ),
    (
        "state-edited",
        lambda r: edit_json(r / CKPT / "state.json", lambda s: s["loop"].update(env_steps=5)),
        ("state.json", "modified"),
    ),
    (
        "manifest-missing",
        lambda r: (r / CKPT / "manifest.json").unlink(),
        ("manifest.json", "missing"),
    ),
    (
        "manifest-version",
        lambda r: edit_json(r / CKPT / "manifest.json", lambda m: m.update(format_version=99)),
        ("format_version", "99"),
    ),
    (
        "extra-file",
        lambda r: (r / CKPT / "payload.bin").write_bytes(b"x"),
        ("unexpected file", "payload.bin"),
    ),
    (
        "no-checkpoints",
        lambda r: shutil.rmtree(r / "checkpoints"),
        ("no checkpoint to resume from", "checkpoints"),
    ),
    # Re-hashed forgeries: integrity holds, content validation must refuse them.
    (
        "forged-counter-type",
        lambda r: rewrite(r, lambda s, t: s["loop"].update(env_steps="abc")),
        ("loop.env_steps", "'abc'"),
    ),
    (
        "forged-hyperparameter",
        lambda r: rewrite(r, lambda s, t: s["hyperparameters"].update(gamma=0.5)),
        ("gamma", "0.5"),
    ),
    ("forged-missing-tensor", lambda r: rewrite(r, _drop_replay_rewards), ("replay", "rewards")),
    (
        "forged-env-state",
        lambda r: rewrite(r, lambda s, t: s["envs"][0]["base"]["attrs"].update(state="zz")),
        ("state", "'zz'"),
    ),
    (
        "forged-replay-action",  # an index past the Q-head crashed the first update
        lambda r: rewrite(r, lambda s, t: t["replay.actions"].__setitem__(0, 7)),
        ("replay.actions", "action 7", "0..1"),
    ),
    (
        "forged-counterfactual-action",  # stored beside the n-step queue (action_augmentation)
        lambda r: rewrite(
            r, lambda s, t: t.__setitem__("nstep.0.cf_actions", t["replay.actions"][:1] * 0 + 7)
        ),
        ("nstep.0.cf_actions", "action 7"),
    ),
    (
        "forged-replay-size",
        lambda r: rewrite(r, lambda s, t: s["replay"].update(size=10**9)),
        ("replay.size", "1000000000"),
    ),
    (
        "forged-next-eval",  # its interval is 0: the loop spun for ever adding 0 to it
        lambda r: rewrite(r, lambda s, t: s["loop"].update(next_eval=250)),
        ("loop.next_eval", "null (its interval is 0)", "250"),
    ),
    (
        "forged-next-checkpoint",  # its interval is 0: a checkpoint at every step from 350 on
        lambda r: rewrite(r, lambda s, t: s["loop"].update(next_ckpt=350)),
        ("loop.next_ckpt", "null (its interval is 0)", "350"),
    ),
    (
        "forged-partial-optimizer-state",  # a KeyError traceback at the first update
        lambda r: rewrite(r, lambda s, t: t.pop("optim.0.exp_avg_sq")),
        ("optimizer state of parameter 0", "exp_avg_sq"),
    ),
    (
        "forged-optimizer-step-number",  # Adam read it at the first update, and died there
        lambda r: rewrite(r, _adam_step_as_a_number),
        ("optim.0.step", "must be a tensor", "3.0"),
    ),
    (
        "forged-learning-rate",  # trained on at 10 while learning_rate said otherwise
        lambda r: rewrite(r, _learning_rate_10),
        ("scheduler.base_lrs", "learning_rate", "10.0"),
    ),
    (
        "config-yaml-edited",
        lambda r: (r / "config.yaml").write_text(
            (r / "config.yaml").read_text().replace("gamma: 0.99", "gamma: 7")
        ),
        ("config.yaml", "gamma", "7"),
    ),
]


@pytest.mark.parametrize(
    ("corrupt", "must"), [pytest.param(c, m, id=i) for i, c, m in CHECKPOINT_ROWS]
)
def test_bad_checkpoint_is_refused_and_the_run_is_left_as_it_was(
    cli: ForkedCli,
    trained: Path,
    tmp_path: Path,
    corrupt: Callable[[Path], None],
    must: tuple[str, ...],
) -> None:
    _refused_and_left_as_it_was(
        cli, trained, tmp_path, corrupt, must, "resume", "--total-steps", "400"
    )


def _refused_and_left_as_it_was(
    cli: ForkedCli,
    trained: Path,
    tmp_path: Path,
    corrupt: Callable[[Path], None],
    must: tuple[str, ...],
    command: str,
    *options: str,
) -> None:
    """``command`` on a damaged copy of ``trained`` is one user error, and changes no file."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    corrupt(run)
    before = snapshot(run)
    assert_user_error(cli(command, str(run), *options, cwd=tmp_path), *must)
    assert snapshot(run) == before


def test_resume_of_a_finished_run_asks_for_more_steps(
    cli: ForkedCli, trained: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = snapshot(run)
    assert_user_error(cli("resume", str(run), cwd=tmp_path), "300", "--total-steps")
    assert_user_error(
        cli("resume", str(run), "--total-steps", "200", cwd=tmp_path), "--total-steps", "200"
    )
    assert snapshot(run) == before


# --- pickles --------------------------------------------------------------------------------------
class Payload:
    """Unpickling this runs ``os.system("touch MARKER")``: the classic malicious checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def plant(run: Path, how: str, marker: Path) -> None:
    import torch

    ck = run / CKPT
    if how == "pickle-as-checkpoint":
        shutil.rmtree(ck)
        ck.write_bytes(pickle.dumps(Payload(marker)))
        return
    target = ck / "tensors.safetensors"
    if how == "pickle-as-tensors":
        target.write_bytes(pickle.dumps({"online.w": Payload(marker)}))
    else:  # torch.save archive: a zip holding a pickle
        torch.save({"online.w": Payload(marker)}, str(target))
    manifest = json.loads((ck / "manifest.json").read_text())  # forged hashes: integrity "holds"
    data = target.read_bytes()
    manifest["files"]["tensors.safetensors"] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
    }
    (ck / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("how", ["pickle-as-checkpoint", "pickle-as-tensors", "torch-save-zip"])
def test_crafted_pickle_checkpoint_is_refused_and_never_executed(
    cli: ForkedCli, trained: Path, tmp_path: Path, how: str
) -> None:
    marker = tmp_path / "PWNED"
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    plant(run, how, marker)
    # Positive control: the planted payload is live - loading it the pickle way runs it.
    planted = run / CKPT if how == "pickle-as-checkpoint" else run / CKPT / "tensors.safetensors"
    loader = (
        "import pickle, sys, zipfile\n"
        "p = sys.argv[1]\n"
        "if zipfile.is_zipfile(p):  # torch.save: the pickle is the archive's data.pkl\n"
        "    z = zipfile.ZipFile(p)\n"
        "    pickle.loads(z.read(next(n for n in z.namelist() if n.endswith('data.pkl'))))\n"
        "else:\n"
        "    pickle.load(open(p, 'rb'))\n"
    )
    subprocess.run([sys.executable, "-c", loader, str(planted)], check=True, timeout=60)
    assert marker.exists()
    marker.unlink()

    before = snapshot(run)
    line = assert_user_error(
        cli("resume", str(run), "--total-steps", "400", cwd=tmp_path), "never unpickles"
    )
    assert "pickle" in line or "zip" in line
    assert not marker.exists()
    assert snapshot(run) == before


def test_pickle_given_as_run_dir_is_refused(cli: ForkedCli, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    evil = tmp_path / "model.pkl"
    evil.write_bytes(pickle.dumps(Payload(marker)))
    for command in ("resume", "evaluate", "report"):
        assert_user_error(cli(command, str(evil), cwd=tmp_path), "got a file", str(evil))
    assert not marker.exists()


def test_planted_pickle_newer_than_a_good_checkpoint_is_skipped(
    cli: ForkedCli, trained: Path, tmp_path: Path
) -> None:
    """The pointer names a pickle; resume falls back to the verified checkpoint, says so in one
    warning line, and never runs the payload."""
    marker = tmp_path / "PWNED"
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    evil = run / "checkpoints" / "step-000000000350"
    evil.write_bytes(pickle.dumps(Payload(marker)))
    (run / "checkpoints" / "latest.json").write_text(
        json.dumps(
            {"format": "foxhunt-latest", "format_version": 1, "checkpoint": evil.name, "step": 350}
        )
    )
    res = cli("resume", str(run), "--total-steps", "400", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.stderr
    assert "Traceback" not in res.stderr
    warning = [line for line in res.stderr.splitlines() if "never unpickles" in line]
    assert len(warning) == 1 and "step-000000000300" in warning[0]
    assert not marker.exists()
    assert (run / "checkpoints" / "step-000000000400").is_dir()


# --- the final model (model.json / model.safetensors of a finished run) ---------------------------
def _poison_weights(run: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(run / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(run / "model.safetensors"))


MODEL_ROWS: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = [
    (
        "hp-missing",
        lambda r: edit_json(r / "model.json", lambda m: m.pop("hyperparameters")),
        ("model.json", "hyperparameters is missing"),
    ),
    (
        "hp-not-a-mapping",
        lambda r: edit_json(r / "model.json", lambda m: m.update(hyperparameters="x")),
        ("model.json", "hyperparameters must be a mapping", "'x'"),
    ),
    (
        "obs-dim-text",
        lambda r: edit_json(r / "model.json", lambda m: m.update(obs_dim="abc")),
        ("model.json", "obs_dim must be an integer", "'abc'"),
    ),
    (
        "obs-dim-negative",
        lambda r: edit_json(r / "model.json", lambda m: m.update(obs_dim=-3)),
        ("model.json", "obs_dim must be at least 1", "-3"),
    ),
    (
        "obs-dim-fraction",
        lambda r: edit_json(r / "model.json", lambda m: m.update(obs_dim=5.7)),
        ("model.json", "obs_dim must be an integer", "5.7"),
    ),
    (
        "obs-dim-huge",
        lambda r: edit_json(r / "model.json", lambda m: m.update(obs_dim=10**12)),
        ("model.json", "obs_dim=1000000000000", "model.safetensors"),
    ),
    (
        "n-regimes-text",
        lambda r: edit_json(r / "model.json", lambda m: m.update(n_regimes="x")),
        ("model.json", "n_regimes must be an integer", "'x'"),
    ),
    (
        "n-actions-missing",
        lambda r: edit_json(r / "model.json", lambda m: m.pop("n_actions")),
        ("model.json", "n_actions is missing"),
    ),
    (
        "hp-bool",
        lambda r: edit_json(r / "model.json", lambda m: m["hyperparameters"].update(n_envs=True)),
        ("model.json", "n_envs must be an integer", "True"),
    ),
    (
        "env-interface-wrong-size",
        lambda r: edit_json(
            r / "model.json",
            lambda m: m.update(env_interface={"one_hot_observation": [3, 0], "action_start": 0}),
        ),
        ("model.json", "env_interface must be", "obs_dim (4)", "[3, 0]"),
    ),
    (
        "env-interface-text",
        lambda r: edit_json(r / "model.json", lambda m: m.update(env_interface="x")),
        ("model.json", "env_interface must be", "'x'"),
    ),
    ("nan-weights", _poison_weights, ("model.safetensors", "non-finite", "tensor '")),
]


@pytest.mark.parametrize(("corrupt", "must"), [pytest.param(c, m, id=i) for i, c, m in MODEL_ROWS])
def test_damaged_model_is_refused_by_evaluate(
    cli: ForkedCli,
    trained: Path,
    tmp_path: Path,
    corrupt: Callable[[Path], None],
    must: tuple[str, ...],
) -> None:
    _refused_and_left_as_it_was(
        cli, trained, tmp_path, corrupt, must, "evaluate", "--episodes", "1"
    )


def test_intact_model_still_evaluates(cli: ForkedCli, trained: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    res = cli("evaluate", str(run), "--episodes", "1", cwd=tmp_path)
    assert res.code == 0, res.stderr


def test_an_edited_trading_section_is_refused_naming_config_yaml(tmp_path: Path) -> None:
    """The trading section stays a plain dict in the RunSpec; a bad value written into a run's
    config.yaml was reported without the file it came from."""
    from foxhunt.errors import ConfigError
    from foxhunt.runs import RunSpec, load_spec

    (tmp_path / "config.yaml").write_text(RunSpec(trading={"cost_bps": -3}).to_yaml())
    with pytest.raises(ConfigError, match=r"config\.yaml: trading\.cost_bps.*-3"):
        load_spec(tmp_path)


def test_a_data_link_that_loops_is_one_line(cli: ForkedCli, tmp_path: Path) -> None:
    """Path.resolve raised RuntimeError on a symlink loop: a traceback (before, the CLI's own
    check called it "not found")."""
    (tmp_path / "loop.csv").symlink_to("loop.csv")
    result = cli(*TRADE, "--data", "loop.csv", cwd=tmp_path)
    assert_user_error(result, "loop.csv", "a symbolic link whose target does not resolve")
    assert not (tmp_path / "run").exists()
