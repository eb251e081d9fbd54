"""DQNHyperparameters: every validation error, with the exact one-line message, presets, files."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from foxhunt.config import DQNHyperparameters, load_config_dict, parse_override
from foxhunt.errors import ConfigError, FoxhuntError


def _error(**kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        DQNHyperparameters(**kwargs)
    msg = str(info.value)
    assert "\n" not in msg, f"error message must be one line, got: {msg!r}"
    return msg


def test_config_error_is_value_error_and_foxhunt_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, FoxhuntError)
    with pytest.raises(ValueError):
        DQNHyperparameters(gradient_accumulation_steps=0)


def test_gradient_accumulation_steps_zero_exact_message() -> None:
    assert _error(gradient_accumulation_steps=0) == (
        "gradient_accumulation_steps must be greater than 0, got: 0"
    )


@pytest.mark.parametrize("field", ["batch_size", "gradient_accumulation_steps", "n_step", "seed"])
@pytest.mark.parametrize("value", [2.5, "3", True, 4.0])
def test_int_fields_reject_non_integers(field: str, value: object) -> None:
    assert _error(**{field: value}) == f"{field} must be an integer, got: {value!r}"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"learning_rate": 0.0}, "learning_rate must be greater than 0.0, got: 0.0"),
        ({"learning_rate": -1e-3}, "learning_rate must be greater than 0.0, got: -0.001"),
        ({"learning_rate": math.inf}, "learning_rate must be finite, got: inf"),
        ({"learning_rate": "fast"}, "learning_rate must be a number, got: 'fast'"),
        ({"gamma": 1.01}, "gamma must be at most 1.0, got: 1.01"),
        # A hundred thousand threads exhausted memory before the first step.
        ({"torch_threads": 100_000}, "torch_threads must be at most 1024, got: 100000"),
        ({"gamma": -0.1}, "gamma must be at least 0.0, got: -0.1"),
        ({"gamma": math.nan}, "gamma must be finite, got: nan"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be greater than 0.0, got: 0.0"),
        ({"max_grad_norm": -2.0}, "max_grad_norm must be greater than 0.0, got: -2.0"),
        ({"max_grad_norm": math.inf}, "max_grad_norm must be finite, got: inf"),
        ({"max_grad_norm": math.nan}, "max_grad_norm must be finite, got: nan"),
        ({"tau": 0.0}, "tau must be greater than 0.0, got: 0.0"),
        ({"momentum": 1.0}, "momentum must be less than 1.0, got: 1.0"),
        ({"n_atoms": 1}, "n_atoms must be at least 2, got: 1"),
        ({"hidden_sizes": [64, 0]}, "hidden_sizes.1 must be greater than 0, got: 0"),
        ({"double_q": "maybe"}, "double_q must be true or false, got: 'maybe'"),
        ({"optimizer": "adagrad"}, "optimizer must be one of"),
        ({"optimizer": "adagrad"}, "got: 'adagrad'"),
        ({"device": "tpu"}, "device must be one of auto, cpu, cuda, cuda:N, mps, got: 'tpu'"),
        ({"device": "cuda:x"}, "got: 'cuda:x'"),
        ({"v_min": 1.0, "v_max": 1.0}, "v_min must be less than v_max (1.0), got: 1.0"),
        ({"v_min": 5.0, "v_max": -5.0}, "v_min must be less than v_max (-5.0), got: 5.0"),
        ({"hidden_sizes": []}, "hidden_sizes must name at least one layer"),
        ({"colour": "red"}, "unknown hyperparameter 'colour' (value 'red')"),
        (
            {"exploration_initial_eps": 0.1, "exploration_final_eps": 0.5},
            "exploration_final_eps must not exceed exploration_initial_eps (0.1), got: 0.5",
        ),
        ({"mixed_precision": "fp16", "device": "cpu"}, "mixed_precision 'fp16' needs a CUDA"),
        # Lax bools took numbers: dueling: -0.0 was recorded as false.
        ({"dueling": -0.0}, "dueling must be true or false, got: -0.0"),
        ({"prioritized_replay": 1}, "prioritized_replay must be true or false, got: 1"),
    ],
)
def test_validation_messages(kwargs: dict[str, Any], fragment: str) -> None:
    assert fragment in _error(**kwargs)


def test_effective_batch_must_fit_in_buffer() -> None:
    msg = _error(batch_size=64, gradient_accumulation_steps=4, buffer_capacity=200)
    assert "64 * 4 = 256" in msg
    assert "must not exceed buffer_capacity, got: buffer_capacity=200" in msg
    # Exactly equal is fine.
    hp = DQNHyperparameters(
        batch_size=64, gradient_accumulation_steps=4, buffer_capacity=256, learning_starts=256
    )
    assert hp.effective_batch_size == 256


def test_learning_starts_must_cover_effective_batch() -> None:
    msg = _error(batch_size=32, gradient_accumulation_steps=8, learning_starts=255)
    assert msg == (
        "learning_starts must be at least the effective batch size 256 "
        "(batch_size * gradient_accumulation_steps), got: 255"
    )
    assert (
        DQNHyperparameters(
            batch_size=32, gradient_accumulation_steps=8, learning_starts=256
        ).learning_starts
        == 256
    )


def test_several_errors_stay_on_one_line() -> None:
    msg = _error(learning_rate=-1.0, gamma=2.0)
    assert "learning_rate must be greater than 0.0" in msg
    assert "gamma must be at most 1.0" in msg


def test_presets_build_and_effective_batch_size() -> None:
    cons = DQNHyperparameters.conservative()
    assert cons.double_q and cons.gradient_accumulation_steps == 1
    assert cons.effective_batch_size == cons.batch_size == 64
    rb = DQNHyperparameters.rainbow()
    assert (rb.dueling, rb.prioritized_replay, rb.noisy_nets) == (True, True, True)
    assert (rb.n_step, rb.distributional) == (3, "c51")
    cp = DQNHyperparameters.cartpole()
    assert cp.learning_rate == pytest.approx(2.3e-3)
    assert cp.hidden_sizes == (128, 128) and cp.n_envs == 4
    big = DQNHyperparameters.rainbow(batch_size=32, gradient_accumulation_steps=8)
    assert big.effective_batch_size == 256
    # Preset overrides are validated like anything else.
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be greater than 0"):
        DQNHyperparameters.conservative(gradient_accumulation_steps=0)


def test_replace_revalidates_and_is_immutable() -> None:
    hp = DQNHyperparameters()
    hp2 = hp.replace(gradient_accumulation_steps=4, batch_size=16)
    assert hp2.effective_batch_size == 64 and hp.effective_batch_size == 64
    assert hp2.gradient_accumulation_steps == 4 and hp.gradient_accumulation_steps == 1
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be greater than 0"):
        hp.replace(gradient_accumulation_steps=0)
    with pytest.raises(ConfigError, match="must not exceed buffer_capacity"):
        hp.replace(buffer_capacity=10)
    with pytest.raises(Exception):  # noqa: B017 - frozen pydantic model
        hp.gamma = 0.5  # type: ignore[misc]


def test_to_dict_round_trip() -> None:
    hp = DQNHyperparameters(hidden_sizes=(64, 32), learning_rate=3e-4)
    d = hp.to_dict()
    assert d["hidden_sizes"] == [64, 32]
    assert DQNHyperparameters(**d) == hp


def test_yaml_loading(tmp_path: Path) -> None:
    f = tmp_path / "hp.yaml"
    f.write_text(
        "learning_rate: 1e-3\nbatch_size: 32\ngradient_accumulation_steps: 4\n"
        "hidden_sizes: [64, 64]\nlearning_starts: 128\n",
        encoding="utf-8",
    )
    hp = DQNHyperparameters.from_yaml(f, gamma=0.9)
    assert hp.learning_rate == 1e-3 and isinstance(hp.learning_rate, float)
    assert hp.effective_batch_size == 128
    assert hp.hidden_sizes == (64, 64)
    assert hp.gamma == 0.9
    # A nested "hyperparameters:" key is accepted too.
    nested = tmp_path / "nested.yaml"
    nested.write_text("hyperparameters:\n  batch_size: 16\n  learning_starts: 16\n")
    assert DQNHyperparameters.from_yaml(nested).batch_size == 16


def test_yaml_scientific_notation_is_a_number(tmp_path: Path) -> None:
    f = tmp_path / "sci.yaml"
    f.write_text("learning_rate: 1e-3\nq_divergence_bound: 1e6\n", encoding="utf-8")
    data = load_config_dict(f)
    assert data == {"learning_rate": 1e-3, "q_divergence_bound": 1e6}


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="config file not found"):
        DQNHyperparameters.from_yaml(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("learning_rate: [1, 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not valid YAML") as info:
        DQNHyperparameters.from_yaml(bad)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        DQNHyperparameters.from_yaml(scalar)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("gradient_accumulation_steps: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be greater than 0"):
        DQNHyperparameters.from_yaml(wrong)


def test_a_misspelt_hyperparameter_gets_a_suggestion() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown hyperparameter 'learning_rat' \(value 0\.1\); "
        r"did you mean 'learning_rate'\?",
    ):
        DQNHyperparameters(learning_rat=0.1)


def test_integers_are_read_in_decimal(tmp_path: Path) -> None:
    # YAML 1.1 read seed=010 as octal 8 and batch_size=1:00 as 60 (base 60), without a word.
    assert parse_override("seed=010") == ("seed", 10)
    assert parse_override("buffer_capacity=100_000") == ("buffer_capacity", 100_000)
    assert parse_override("seed=-0") == ("seed", 0)
    for text in ("1:00", "0x10", "0b11", "0o7"):
        key, value = parse_override(f"batch_size={text}")
        assert value == text  # text: the field refuses it by name
        with pytest.raises(ConfigError, match=f"batch_size must be an integer, got: '{text}'"):
            DQNHyperparameters(**{key: value})
    f = tmp_path / "c.yaml"
    f.write_text("seed: 010\nlog_interval: 1:00:00\n", encoding="utf-8")
    assert load_config_dict(f) == {"seed": 10, "log_interval": "1:00:00"}


def test_written_config_reads_back_unchanged(tmp_path: Path) -> None:
    # "08" was written bare by YAML 1.1's rules and read back as the integer 8.
    from foxhunt.config import dump_yaml

    data = {"map": "08", "e": "1e3", "o": "010", "n": 8, "lr": 1e-3, "t": "1:00", "y": "yes"}
    data |= {"d": "2024-01-02", "g": "1_000", "inf": float("inf"), "none": None, "l": [1, 2]}
    f = tmp_path / "c.yaml"
    f.write_text(dump_yaml(data), encoding="utf-8")
    assert load_config_dict(f) == data


def test_parse_override() -> None:
    assert parse_override("hidden_sizes=[64, 64]") == ("hidden_sizes", [64, 64])
    key, value = parse_override("learning_rate=1e-3")
    assert key == "learning_rate" and isinstance(value, float) and value == 1e-3
    assert parse_override("gamma=0.95") == ("gamma", 0.95)
    assert parse_override("batch_size=32") == ("batch_size", 32)
    assert parse_override(" dueling = true") == ("dueling", True)
    assert parse_override("optimizer=sgd") == ("optimizer", "sgd")
    assert parse_override("max_grad_norm=null") == ("max_grad_norm", None)
    for bad in ("noequals", "=3"):
        with pytest.raises(ConfigError, match="--set expects key=value") as info:
            parse_override(bad)
        assert repr(bad) in str(info.value)
    with pytest.raises(ConfigError, match="learning_rate must be finite"):
        parse_override("learning_rate=.inf")
    # An override goes through the same validation as everything else.
    k, v = parse_override("gradient_accumulation_steps=0")
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be greater than 0"):
        DQNHyperparameters(**{k: v})


def test_settings_without_effect_are_reported():
    from foxhunt.session import ignored_settings

    H = DQNHyperparameters
    assert ignored_settings(H()) == []
    assert ignored_settings(H.rainbow()) == []  # epsilon 0 agrees with noisy nets
    assert ignored_settings(H.rainbow(exploration_fraction=0.3)) == []  # no schedule to stretch
    from pathlib import Path

    from foxhunt.runs import build_spec

    for shipped in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        assert ignored_settings(build_spec(config_file=str(shipped)).hyperparameters) == [], shipped
    assert ignored_settings(H.cartpole()) == []
    assert ignored_settings(H.trading()) == []
    assert ignored_settings(H(exploration_final_eps=0.2)) == []  # epsilon-greedy: used
    assert ignored_settings(H(noisy_nets=True)) == []  # defaults: nothing was asked for
    noisy = H(noisy_nets=True, exploration_final_eps=0.2, exploration_fraction=0.5)
    assert [n for n, _ in ignored_settings(noisy)] == [
        ["exploration_final_eps", "exploration_fraction"]
    ]
    cases = {
        "noisy_sigma0": H(noisy_sigma0=0.3),
        "loss": H(distributional="c51", loss="mse"),
        "huber_delta": H(loss="mse", huber_delta=2.0),
        "huber_delta ": H(distributional="c51", huber_delta=2.0),
        "n_atoms": H(n_atoms=7),
        "v_min": H(distributional="qr", v_min=-5.0),
        "momentum": H(optimizer="adam", momentum=0.9),
        "adam_eps": H(optimizer="sgd", adam_eps=0.1),
        "lr_final_ratio": H(lr_schedule="step", lr_final_ratio=0.5),
        "lr_step_size": H(lr_schedule="cosine", lr_step_size=5),
        "per_alpha": H(per_alpha=0.7),
        "regime_gating": H(regime_gating="soft"),
    }
    for name, hp in cases.items():
        assert [n for n, _ in ignored_settings(hp)] == [[name.strip()]], name
    # Where they apply, the same values are used and not reported.
    assert ignored_settings(H(distributional="qr", huber_delta=2.0, n_atoms=7)) == []
    assert ignored_settings(H(optimizer="sgd", momentum=0.9, lr_schedule="step")) == []
    # lr_decay_steps' default was 100000 before None: every older config.yaml holds it
    assert ignored_settings(H(lr_decay_steps=100_000)) == []
    assert [n for n, _ in ignored_settings(H(lr_decay_steps=5000))] == [["lr_decay_steps"]]


@pytest.mark.parametrize(
    "field", ["learning_rate", "gamma", "tau", "v_min", "max_grad_norm", "weight_decay"]
)
@pytest.mark.parametrize("value", [True, False])
def test_float_fields_reject_booleans(field: str, value: bool) -> None:
    assert _error(**{field: value}) == f"{field} must be a number, got: {value!r}"


def test_yaml_yes_for_a_float_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "hp.yaml"
    f.write_text("gamma: yes\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^gamma must be a number, got: True$"):
        DQNHyperparameters.from_yaml(f)
    with pytest.raises(ConfigError, match=r"^tau must be a number, got: True$"):
        DQNHyperparameters(**dict([parse_override("tau=true")]))
    assert DQNHyperparameters(learning_rate=1).learning_rate == 1.0  # an int is still a number


def test_seed_is_bounded_to_32_bits() -> None:
    assert DQNHyperparameters(seed=2**32 - 1).seed == 2**32 - 1
    for bad in (2**32, 99999999999999999999999):
        assert _error(seed=bad) == f"seed must be less than 4294967296, got: {bad}"


def test_unquoted_off_means_off_for_mixed_precision(tmp_path: Path) -> None:
    f = tmp_path / "hp.yaml"
    f.write_text("mixed_precision: off\n", encoding="utf-8")
    assert DQNHyperparameters.from_yaml(f).mixed_precision == "off"
    for item in ("mixed_precision=off", "mixed_precision=no"):
        key, value = parse_override(item)
        assert value is False and DQNHyperparameters(**{key: value}).mixed_precision == "off"
    hint = "(YAML reads unquoted off/no/yes/on as booleans; quote the value)"
    assert _error(mixed_precision=True) == (
        f"mixed_precision must be one of 'off', 'bf16' or 'fp16', got: True {hint}"
    )
    assert _error(optimizer=False).endswith(f"got: False {hint}")
    assert _error(device=False) == f"device must be a string, got: False {hint}"


def test_duplicate_yaml_keys_are_refused_with_file_key_and_line(tmp_path: Path) -> None:
    cases = {
        "flat.yaml": ("gamma: 0.9\nbatch_size: 32\ngamma: 0.5\n", "'gamma' on line 3"),
        "sections.yaml": (
            "hyperparameters:\n  gamma: 0.9\nhyperparameters:\n  tau: 0.5\n",
            "'hyperparameters' on line 3",
        ),
        "nested.yaml": ("hyperparameters:\n  tau: 0.5\n  tau: 0.4\n", "'tau' on line 3"),
    }
    for name, (text, where) in cases.items():
        f = tmp_path / name
        f.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError) as info:
            load_config_dict(f, flatten=False)
        msg = str(info.value)
        assert msg.startswith(f"config file {f}: duplicate key ") and where in msg, msg
        assert "(first set on line" in msg and "\n" not in msg
    # A merge key may still be overridden on purpose.
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {gamma: 0.9, tau: 0.5}\nhp:\n  <<: *b\n  gamma: 0.8\n")
    assert load_config_dict(merged)["hp"] == {"gamma": 0.8, "tau": 0.5}
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("gamma: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config_dict(unsafe)


def test_parse_override_refuses_empty_values_and_broken_yaml() -> None:
    for item in ("max_grad_norm=", "market.data=", "gamma=  "):
        key = item.split("=")[0]
        with pytest.raises(ConfigError) as info:
            parse_override(item)
        assert str(info.value).startswith(
            f"--set {key}= has an empty value; give a value, or {key}=null where the "
            "setting may be unset"
        )
    for raw in ("[64,", "{a: 1", "[1, 2]]"):
        with pytest.raises(ConfigError) as info:
            parse_override(f"hidden_sizes={raw}")
        msg = str(info.value)
        assert msg.startswith(f"--set hidden_sizes: value {raw!r} is not valid YAML"), msg
    assert parse_override("device=cuda:0") == ("device", "cuda:0")


def test_flat_config_file_with_an_unknown_key_names_the_file(tmp_path: Path) -> None:
    from foxhunt.runs import build_spec

    f = tmp_path / "flat.yaml"
    f.write_text("gamma: 0.9\ntotal_env_step: 300\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown key 'total_env_step'") as info:
        build_spec(env="CartPole-v1", config_file=str(f))
    assert str(info.value).startswith(f"{f}: ")
    with pytest.raises(ConfigError) as info:
        DQNHyperparameters.from_yaml(f)
    assert str(info.value) == f"{f}: unknown hyperparameter 'total_env_step' (value 300)"
    ok = tmp_path / "ok.yaml"
    ok.write_text("gamma: 0.9\n", encoding="utf-8")
    assert build_spec(env="CartPole-v1", config_file=str(ok)).hyperparameters.gamma == 0.9


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trading.window", "trading.window: Input should be a valid integer (got True)"),
        (
            "trading.initial_position",
            "trading.initial_position: Input should be a valid integer (got True)",
        ),
        ("trading.cost_bps", "trading.cost_bps: Input should be a valid number (got True)"),
        ("market.n_regimes", "market.n_regimes must be an integer, got: True"),
        ("market.train_fraction", "market.train_fraction must be a number, got: True"),
        ("market.synthetic_seed", "market.synthetic_seed must be an integer, got: True"),
    ],
)
def test_trading_and_market_settings_refuse_booleans(override: str, message: str) -> None:
    from foxhunt.runs import build_spec

    with pytest.raises(ConfigError) as info:
        build_spec(overrides={override: True})
    assert str(info.value) == message


def test_trading_positions_refuse_booleans() -> None:
    from foxhunt.envs.trading import TradingEnvConfig

    with pytest.raises(ConfigError, match=r"trading.positions.0: .*valid number \(got True\)"):
        TradingEnvConfig(positions=[True, False])
    assert TradingEnvConfig(positions=[0, 1]).positions == (0.0, 1.0)


def test_the_trading_preset_or_regime_network_with_a_gym_env_names_its_source(
    tmp_path: Path,
) -> None:
    from foxhunt.runs import build_spec

    with pytest.raises(ConfigError, match=r"--preset trading is for the trading environment"):
        build_spec(env="CartPole-v1", preset_name="trading")
    cfg = tmp_path / "t.yaml"
    cfg.write_text("regime_conditional: true\n")
    with pytest.raises(ConfigError, match=rf"regime_conditional: true \(from {cfg}\)"):
        build_spec(env="CartPole-v1", config_file=str(cfg))
    with pytest.raises(ConfigError, match=r"regime_conditional: true \(from --set\)"):
        build_spec(env="CartPole-v1", overrides={"regime_conditional": True})


def test_shipped_configs_train_what_their_name_says() -> None:
    """configs/cartpole.yaml without an env key trained the trading agent with CartPole values."""
    from pathlib import Path

    from foxhunt.runs import build_spec

    for shipped in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        spec = build_spec(config_file=str(shipped))
        expected = "CartPole-v1" if shipped.stem.startswith("cartpole") else None
        assert spec.env == expected, shipped


def test_run_settings_given_twice_must_agree() -> None:
    from foxhunt.runs import build_spec

    with pytest.raises(ConfigError, match="--seed 5 and --set seed=7 disagree"):
        build_spec(env="CartPole-v1", overrides={"seed": 7}, seed=5)
    with pytest.raises(ConfigError, match="--total-steps 100 and --set total_env_steps=200"):
        build_spec(env="CartPole-v1", overrides={"total_env_steps": 200}, total_steps=100)
    with pytest.raises(ConfigError, match=r"--seed 1 and --set seed=1\.0 disagree"):
        build_spec(env="CartPole-v1", overrides={"seed": 1.0}, seed=1)
    spec = build_spec(env="CartPole-v1", overrides={"total_env_steps": 200, "seed": 3}, seed=3)
    assert spec.total_env_steps == 200 and spec.hyperparameters.seed == 3


def test_every_gymnasium_env_starts_from_the_classic_preset() -> None:
    """The plain defaults learned nothing on Acrobot or MountainCar (BENCHMARKS §2)."""
    from pathlib import Path

    from foxhunt.runs import build_spec, preset

    classic = DQNHyperparameters.cartpole()
    for env in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
        assert build_spec(env=env).hyperparameters == classic
    assert preset("classic") == preset("cartpole") == classic
    plain = build_spec(env="Acrobot-v1", preset_name="default").hyperparameters
    assert plain == DQNHyperparameters() != classic
    assert build_spec().hyperparameters == DQNHyperparameters.trading()
    # A flat run file's env and step budget are the run's: from_yaml takes the rest.
    shipped = Path(__file__).parents[1] / "configs" / "cartpole.yaml"
    assert DQNHyperparameters.from_yaml(shipped) == DQNHyperparameters.classic() == classic
    # configs/trading.yaml is the preset too: it pinned the LR decay at 14 500 optimizer steps
    # after the preset's decay came to follow the run's total (another --total-steps differed).
    trading = Path(__file__).parents[1] / "configs" / "trading.yaml"
    assert DQNHyperparameters.from_yaml(trading) == DQNHyperparameters.trading()


def test_numpy_numbers_from_sweeps_are_the_numbers_they_hold():
    """np.int64 from a sweep is an integer; np.float32(1e-3) is 0.001, not its float32 rounding."""
    import numpy as np

    from foxhunt.envs.trading import TradingEnvConfig

    hp = DQNHyperparameters(
        batch_size=np.int64(32),
        learning_rate=np.float32(1e-3),
        hidden_sizes=np.array([8, 4]),
        dueling=np.bool_(False),
    )
    assert hp.batch_size == 32 and type(hp.batch_size) is int
    assert hp.learning_rate == 0.001 and hp.hidden_sizes == (8, 4) and hp.dueling is False
    assert DQNHyperparameters(gamma=np.float64(0.97)).gamma == 0.97
    with pytest.raises(ConfigError, match=r"batch_size must be an integer, got: 3.5"):
        DQNHyperparameters(batch_size=np.float64(3.5))
    cfg = TradingEnvConfig(window=np.int64(4), cost_bps=np.float32(1.5))
    assert cfg.window == 4 and type(cfg.window) is int and cfg.cost_bps == 1.5


def test_n_envs_is_bounded_and_within_the_run_budget():
    """A million envs would all be built before the first step (it hung); more envs than env
    steps cannot take one vector step."""
    from foxhunt.runs import build_spec

    with pytest.raises(ConfigError, match="n_envs must be at most 4096, got: 1000000"):
        DQNHyperparameters(n_envs=10**6)
    with pytest.raises(FoxhuntError, match=r"n_envs \(500\) exceeds total_env_steps \(300\)"):
        build_spec(env="CartPole-v1", total_steps=300, overrides={"n_envs": 500})
    assert (
        build_spec(
            env="CartPole-v1", total_steps=300, overrides={"n_envs": 300}
        ).hyperparameters.n_envs
        == 300
    )


def test_a_data_file_with_a_synthetic_seed_is_refused(tmp_path):
    from foxhunt.markets.synthetic import write_synthetic_csv
    from foxhunt.runs import build_spec

    path = tmp_path / "m.csv"
    write_synthetic_csv(path, seed=1)
    with pytest.raises(ConfigError, match=r"market.synthetic_seed applies to the synthetic"):
        build_spec(data=str(path), overrides={"market.synthetic_seed": 5})
    assert build_spec(data=str(path)).market.synthetic_seed == 0


def test_section_typos_and_shapes_are_named(tmp_path):
    """An unknown key in a config file's trading or market section names the file and the
    likely key; a scalar where a list goes says list; random_start takes booleans only."""
    from foxhunt.runs import build_spec

    cfg = tmp_path / "run.yaml"
    for body, needle in (
        (
            "trading:\n  cost_bsp: 2\n",
            "run.yaml: unknown setting 'trading.cost_bsp' (value 2); did you mean 'cost_bps'?",
        ),
        (
            "market:\n  detecter: hmm\n",
            "run.yaml: unknown setting 'market.detecter' (value 'hmm'); did you mean 'detector'?",
        ),
    ):
        cfg.write_text(body)
        with pytest.raises(ConfigError) as info:
            build_spec(config_file=str(cfg))
        assert needle in str(info.value)
    for key, value, needle in (
        ("market.test_fraction", 0.1, "known: data, detector, detector_seed, features"),
        ("trading.positions", 1, "trading.positions: must be a list such as [0.0, 1.0]"),
        ("market.features", "abc", "market.features must be a list"),
        ("trading.random_start", 0.0, "trading.random_start must be true or false, got: 0.0"),
    ):
        with pytest.raises(ConfigError) as info:
            build_spec(overrides={key: value})
        assert needle in str(info.value), str(info.value)


def test_a_recorded_run_with_settings_new_runs_refuse_still_loads(tmp_path):
    """random_start stored as 0.0, or costs that wipe out the account on one trade, were
    accepted before: such a run directory must still evaluate and resume."""
    from foxhunt.runs import RunSpec

    spec = RunSpec(
        trading={
            "random_start": 0.0,
            "cost_bps": 500.0,
            "slippage_bps": 500.0,
            "positions": [-5.0, 5.0],
        }
    )
    config = spec.trading_config()
    assert config.random_start is False and config.cost_rate == 0.1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        # A 5 000-layer network trained (and hung); a million-episode evaluation never ended.
        ({"hidden_sizes": [4] * 65}, "hidden_sizes must name at most 64 layers, got: 65"),
        ({"eval_episodes": 2_000_000}, "eval_episodes must be at most 1000000, got: 2000000"),
        # Sizes torch cannot unpack into a C long, a sigma past float32: TypeError/RuntimeError
        # tracebacks while the network was built.
        ({"hidden_sizes": [64, 10**30]}, "hidden_sizes must be below 2**31, got: 10000000000"),
        ({"distributional": "qr", "n_atoms": 10**30}, "n_atoms must be below 2**31, got: 1000"),
        ({"noisy_nets": True, "noisy_sigma0": 1e308}, "noisy_sigma0 must fit in float32"),
        # The C51 support is float32: an edge past its range crashed building the network, a
        # width past it gave inf/nan atoms, atoms closer than its spacing a wrong projection.
        ({"v_min": -1e300}, "v_min must lie within float32's range (+-3.403e+38)"),
        ({"v_min": -3.4e38, "v_max": 3.4e38}, "C51 atoms finite and distinct in float32"),
        ({"v_min": 1e6, "v_max": 1e6 + 0.5}, "C51 atoms finite and distinct in float32"),
        ({"v_min": 0.0, "v_max": 1e-300}, "C51 atoms finite and distinct in float32"),
    ],
)
def test_new_runs_refuse_what_recorded_runs_still_load(
    settings: dict[str, Any], message: str
) -> None:
    """Checks added later apply to new runs only: a run directory recorded with these values
    (they trained) must still resume and evaluate."""
    from foxhunt.runs import RunSpec, build_spec

    hp = {"distributional": "c51", **settings} if "v_min" in settings else settings
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_spec(env="CartPole-v1", overrides=dict(hp))
    recorded = RunSpec(env="CartPole-v1", hyperparameters=DQNHyperparameters(**hp))
    assert RunSpec.model_validate(recorded.model_dump(mode="json")) == recorded


def test_fuzzed_settings_are_one_line_refusals(tmp_path: Path) -> None:
    """Keys and values a settings fuzzer found crashing (exit 1, a traceback), accepted, or
    named wrongly."""
    from foxhunt.runs import build_spec

    def refused(needle: str, **kwargs: Any) -> None:
        with pytest.raises(ConfigError) as info:
            build_spec(**kwargs)
        message = str(info.value)
        assert needle in message and "\n" not in message and len(message) < 400, message

    def config(text: str) -> str:
        path = tmp_path / "run.yaml"
        path.write_text(text)
        return str(path)

    refused("unknown key 1", config_file=config("1: 2\n"))  # difflib: 'int' not iterable
    refused("unknown setting 'trading.1'", config_file=config("trading:\n  1: 2\n"))  # KeyError
    refused("seed must be", config_file=config(f"seed: {'9' * 5000}\n"))  # 4300-digit limit
    refused("total_env_steps must be a positive integer, got: None",
            overrides={"total_env_steps": None})  # fmt: skip  # trained the default 60 000
    for key in ("market.", "trading.", "env_kwargs."):  # 'market.hyperparameters', '(model)'
        refused(f"--set {key}: give the setting's name after the dot", overrides={key: 1})
    refused("market.data must be a file path, got an empty string",
            config_file=config("market:\n  data: ''\n"))  # fmt: skip  # "unknown suffix"
    refused("device must be one of", overrides={"device": "x" * 3000})  # echoed whole


def test_a_c51_support_past_float32_is_refused_when_the_network_is_built() -> None:
    """From Python (no build_spec), edges past float32 raised inside torch.linspace, a width
    past it gave inf/nan atoms: both are a ConfigError naming v_min and v_max."""
    from foxhunt.networks import QNetwork

    for v_min, v_max in ((-1e300, 1e300), (-3.4e38, 3.4e38)):
        hp = DQNHyperparameters(distributional="c51", v_min=v_min, v_max=v_max, hidden_sizes=(8,))
        with pytest.raises(ConfigError, match="C51 support finite in float32, got: v_min="):
            QNetwork(4, 2, hp)


def test_values_in_errors_are_cut_short_and_yaml_aliases_are_bounded(tmp_path: Path) -> None:
    """A 5 000-item list made a 15 000-character error line; a YAML alias naming its own list
    recursed until a RecursionError, and nested aliases (a billion values) hung validation."""
    message = _error(learning_rate=[1] * 5000)
    assert message.startswith("learning_rate must be a number, got: [1, 1, ") and len(message) < 150
    assert message.endswith("...")
    from foxhunt.runs import build_spec

    with pytest.raises(ConfigError, match=r"^trading.window: .*\(got \[1, 1, .*\.\.\.\)$"):
        build_spec(overrides={"trading.window": [1] * 5000})
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("trading: {positions: &a [*a]}\n")
    with pytest.raises(ConfigError, match=r"recursive\.yaml nests .* more than 32 deep"):
        build_spec(config_file=str(recursive))
    laughs = ["l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    laughs += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    billion = tmp_path / "laughs.yaml"
    billion.write_text("\n".join([*laughs, "hidden_sizes: *l8"]) + "\n")
    with pytest.raises(ConfigError, match=r"laughs\.yaml holds more than 100,000 values"):
        DQNHyperparameters.from_yaml(billion)
    # A long plain file is not aliases expanding: 120 000 values in a recorded env_kwargs load.
    long = tmp_path / "long.yaml"
    long.write_text(
        "env: CartPole-v1\nenv_kwargs: {prices: [" + ", ".join(["1.5"] * 120_000) + "]}\n"
    )
    assert len(load_config_dict(long, flatten=False)["env_kwargs"]["prices"]) == 120_000
    # Merge keys and ordinary aliases still work.
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "hyperparameters:\n  <<: &common {hidden_sizes: [32, 32]}\n  batch_size: 16\n"
    )
    hp = build_spec(env="CartPole-v1", config_file=str(merged)).hyperparameters
    assert hp.hidden_sizes == (32, 32) and hp.batch_size == 16
