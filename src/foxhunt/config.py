"""Hyperparameters: one validated model, the single home of every default.

Errors name the field and the value (``gradient_accumulation_steps must be greater than 0, got: 0``)
because a user staring at a YAML file needs to know which line to fix. Every schedule is counted in
optimizer steps (learning rate, target sync) or environment steps (exploration, PER beta), never in
micro-batches, so ``gradient_accumulation_steps`` changes memory use and nothing else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from foxhunt.errors import ConfigError

StrictInt = Annotated[int, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
# Strict: a YAML ``true`` is a bool, and a lax float or int would take it silently as 1.0 or 1.
StrictFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
# Strict too: a lax bool takes 0, 1 and -0.0 (dueling: -0.0 was recorded as false).
StrictBool = Annotated[bool, Strict()]
Fraction = Annotated[StrictFloat, Field(ge=0.0, le=1.0)]
PositiveFloat = Annotated[StrictFloat, Field(gt=0.0)]
Seed = Annotated[int, Strict(), Field(ge=0, lt=2**32)]
"""Legacy NumPy seeding takes < 2**32; the offsets added per env, rank and episode (a few million)
keep derived seeds far below torch's 2**64 limit."""

_YAML_BOOL_HINT = " (YAML reads unquoted off/no/yes/on as booleans; quote the value)"

_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class DuplicateKeyError(yaml.YAMLError):
    """A mapping sets the same key twice; PyYAML would silently keep the last value."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {key!r} on line {line} (first set on line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's numbers: ``1e-3`` is a float (PyYAML's 1.1 rules need
    ``1.0e-3``), and an integer is written in decimal: 1.1 read ``seed: 010`` as octal 8 and
    ``1:00`` as 60 (base 60); ``010`` is now 10, and ``1:00`` or ``0x10`` stay text, which a
    number field refuses by name.

    It also refuses duplicate keys, which PyYAML resolves as last-wins without a word.
    """

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(self.construct_scalar(node)).replace("_", "")
        try:
            return int(text)
        except ValueError:  # past Python's 4300-digit limit: text, which the field refuses by name
            return text

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            # Merge keys (``<<: *base``) may be overridden on purpose; only plain keys count.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# PyYAML's 1.1 number resolvers dropped (octal, base 60, binary and hex integers; base-60
# floats), then YAML 1.2's decimal forms added (digit groups with "_" kept, as in Python).
_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if not tag.endswith((":int", ":float"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_constructor("tag:yaml.org,2002:int", _YamlLoader.construct_yaml_int)
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9][0-9_]*$"), list("-+0123456789")
)
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


class _YamlDumper(yaml.SafeDumper):
    """SafeDumper that quotes what :class:`_YamlLoader` would read as another type: "08" or
    "1e3" written bare by YAML 1.1's rules came back as the numbers 8 and 1000.0."""


_YamlDumper.yaml_implicit_resolvers = _YamlLoader.yaml_implicit_resolvers


def dump_yaml(data: Any) -> str:
    """``data`` as YAML that :func:`load_config_dict` and ``--set`` read back unchanged."""
    return yaml.dump(data, Dumper=_YamlDumper, sort_keys=False)


def python_scalars(value: Any) -> Any:
    """NumPy scalars as the Python numbers they hold, in lists, tuples and mappings too
    (``np.int64(32)`` is 32, ``np.float32(1e-3)`` is 0.001). Sweeps and Optuna hand out NumPy
    numbers: a strict integer field would refuse them, and a float32 would carry its binary
    rounding (0.0010000000474974513) into the run and its files."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        # str() of a float32 is its shortest round-tripping decimal: the number that was meant.
        return float(str(value)) if value.dtype.itemsize < 8 else float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()  # Python numbers, nested lists for more dimensions
    if isinstance(value, list | tuple):
        return type(value)(python_scalars(v) for v in value)
    if isinstance(value, dict):
        return {k: python_scalars(v) for k, v in value.items()}
    return value


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for a misspelt field, else the known fields (a short list)."""
    import difflib

    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known: {', '.join(known)}" if len(known) <= 12 else ""


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error names the value, not all of it
    (a 5 000-item list once made a 15 000-character error line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_validation_error(
    err: ValidationError, prefix: str = "", known: Iterable[str] | None = None
) -> str:
    """Turn pydantic's multi-line report into one line per problem, naming field and value
    (``known``: the fields an unknown one is compared with)."""
    parts: list[str] = []
    for e in err.errors(include_url=False):
        field = prefix + (".".join(str(p) for p in e["loc"]) or "hyperparameters")
        value = e.get("input")
        ctx = e.get("ctx") or {}
        kind = e["type"]
        if kind == "greater_than":
            msg = f"{field} must be greater than {ctx['gt']}, got: {shown(value)}"
        elif kind == "greater_than_equal":
            msg = f"{field} must be at least {ctx['ge']}, got: {shown(value)}"
        elif kind == "less_than":
            msg = f"{field} must be less than {ctx['lt']}, got: {shown(value)}"
        elif kind == "less_than_equal":
            msg = f"{field} must be at most {ctx['le']}, got: {shown(value)}"
        elif kind in ("int_type", "int_parsing", "int_from_float"):
            msg = f"{field} must be an integer, got: {shown(value)}"
        elif kind in ("float_type", "float_parsing"):
            msg = f"{field} must be a number, got: {shown(value)}"
        elif kind == "finite_number":
            msg = f"{field} must be finite, got: {shown(value)}"
        elif kind == "bool_type" or kind == "bool_parsing":
            msg = f"{field} must be true or false, got: {shown(value)}"
        elif kind == "literal_error":
            msg = f"{field} must be one of {ctx.get('expected')}, got: {shown(value)}"
            if isinstance(value, bool):
                msg += _YAML_BOOL_HINT
        elif kind == "string_type" and isinstance(value, bool):
            msg = f"{field} must be a string, got: {shown(value)}{_YAML_BOOL_HINT}"
        elif kind == "extra_forbidden":
            what = "setting" if prefix else "hyperparameter"
            msg = f"unknown {what} {field!r} (value {shown(value)})"
            if known is not None:
                msg += did_you_mean(str(e["loc"][-1]), known)
        elif kind in ("tuple_type", "list_type"):
            msg = f"{field} must be a list ([a, b] in YAML), got: {shown(value)}"
        elif kind == "value_error":
            msg = str(ctx.get("error", e["msg"]))
        else:
            msg = f"{field}: {e['msg']}, got: {shown(value)}"
        parts.append(msg)
    return "; ".join(parts)


class DQNHyperparameters(BaseModel):
    """Every knob of a foxhunt DQN / Rainbow run, validated when built.

    The model is immutable; use :meth:`replace` to derive a variant (it re-validates).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True
    )

    # --- optimisation
    learning_rate: PositiveFloat = 1e-3
    """Peak learning rate of the optimizer (after warmup)."""
    gamma: Fraction = 0.99
    """Discount factor per environment step."""
    batch_size: PositiveInt = 64
    """Micro-batch size: samples per forward/backward pass."""
    gradient_accumulation_steps: PositiveInt = 1
    """Micro-batches accumulated into one optimizer step (true accumulation, exact)."""
    max_grad_norm: PositiveFloat | None = 10.0
    """Clip the global gradient norm to this value once per optimizer step; None disables."""
    optimizer: Literal["adam", "adamw", "sgd", "rmsprop"] = "adam"
    """Optimizer family."""
    adam_eps: PositiveFloat = 1e-8
    """Epsilon of Adam/AdamW/RMSprop denominators."""
    weight_decay: Annotated[StrictFloat, Field(ge=0.0)] = 0.0
    """L2 (decoupled for AdamW) weight decay."""
    momentum: Annotated[StrictFloat, Field(ge=0.0, lt=1.0)] = 0.0
    """Momentum for SGD and RMSprop."""
    lr_schedule: Literal["constant", "linear", "cosine", "step"] = "constant"
    """Learning-rate schedule after warmup, counted in optimizer steps."""
    lr_warmup_steps: NonNegativeInt = 0
    """Optimizer steps of linear warmup from 0 to learning_rate."""
    lr_decay_steps: PositiveInt | None = None
    """Optimizer steps over which linear/cosine decay reaches lr_final_ratio (after warmup).
    None = the run's: the decay ends at the last optimizer step ``learn(total)`` plans, so a
    run given another total keeps the schedule's shape (as epsilon's span follows the total,
    and Stable-Baselines3's schedules follow the progress of the run). A later ``learn`` with
    a larger total stretches it from where it is (``foxhunt resume --total-steps`` says so)."""
    lr_final_ratio: Fraction = 0.1
    """Final learning rate as a fraction of learning_rate (linear and cosine)."""
    lr_step_size: PositiveInt = 10_000
    """Optimizer steps between multiplications by lr_step_gamma (step schedule)."""
    lr_step_gamma: Annotated[StrictFloat, Field(gt=0.0, le=1.0)] = 0.5
    """Multiplicative factor of the step schedule."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss for scalar heads (quantile heads always use the quantile Huber loss). ``mse`` is
    ½·TD², Huber's quadratic part, so the two agree inside ``huber_delta``; CleanRL's
    ``F.mse_loss`` is twice it: its gradients are half CleanRL's, so ``max_grad_norm`` clips at
    what is twice the norm there (and with SGD each step is half as long)."""
    huber_delta: PositiveFloat = 1.0
    """Huber threshold (also kappa of the quantile Huber loss)."""

    # --- replay and training cadence
    buffer_capacity: PositiveInt = 100_000
    """Transitions kept in replay (preallocated)."""
    learning_starts: NonNegativeInt = 1_000
    """Environment steps of uniform-random collection before the first update."""
    train_freq: PositiveInt = 4
    """Environment steps (summed over parallel envs) between training rounds."""
    gradient_steps: PositiveInt = 1
    """Optimizer steps per training round."""
    target_update_interval: PositiveInt = 1_000
    """Optimizer steps between target-network updates."""
    tau: Annotated[StrictFloat, Field(gt=0.0, le=1.0)] = 1.0
    """Target update coefficient: 1 copies (hard update), < 1 is a Polyak average."""

    # --- exploration
    exploration_initial_eps: Fraction = 1.0
    """Epsilon at the first environment step."""
    exploration_final_eps: Fraction = 0.05
    """Epsilon after the exploration fraction of the run."""
    exploration_fraction: Fraction = 0.1
    """Share of total environment steps over which epsilon decays linearly."""

    # --- network
    torso: Literal["mlp", "cnn"] = "mlp"
    """The shared torso. ``cnn``: the Nature DQN convolutions (Mnih et al. 2015: 32 8x8/4, 64
    4x4/2, 64 3x3/1) over image observations of shape (C, H, W) or (H, W, C), C the smallest
    axis (stacked frames, RGB), or (H, W) (one channel), at least 36 x 36, then the
    ``hidden_sizes`` layers (the paper: ``[512]``). Chosen explicitly, as SB3's ``CnnPolicy``
    is: ``mlp`` flattens an image into one wide input layer."""
    hidden_sizes: tuple[PositiveInt, ...] = (256, 256)
    """Widths of the shared MLP torso, after the convolutions with ``torso: cnn`` (a new run
    takes at most 64 layers; see check_new)."""
    activation: Literal["relu", "tanh", "gelu"] = "relu"
    """Torso activation."""
    double_q: StrictBool = True
    """Double DQN: the online net picks the next action, the target net values it."""
    dueling: StrictBool = False
    """Dueling heads: Q = V + A - mean(A)."""
    distributional: Literal["none", "c51", "qr"] = "none"
    """Return-distribution head: none (scalar Q), C51 (categorical) or QR-DQN (quantiles)."""
    n_atoms: Annotated[int, Strict(), Field(ge=2)] = 51
    """Atoms (C51) or quantiles (QR-DQN)."""
    v_min: StrictFloat = -10.0
    """Lower edge of the C51 support."""
    v_max: StrictFloat = 10.0
    """Upper edge of the C51 support."""
    noisy_nets: StrictBool = False
    """Factorised-Gaussian noisy heads; noise is resampled once per optimizer step."""
    noisy_sigma0: PositiveFloat = 0.5
    """Initial noise scale of noisy layers (Fortunato et al. 2018, sigma_0)."""
    regime_conditional: StrictBool = False
    """Per-regime heads selected by the regime estimate (the last n_regimes observation entries)."""
    regime_gating: Literal["hard", "soft", "residual"] = "hard"
    """hard: the argmax regime's head; soft: heads mixed by regime probabilities; residual: a
    shared head plus probability-weighted per-regime corrections."""
    regime_in_torso: StrictBool = True
    """Whether the shared torso also reads the regime probabilities. False: the regime acts only
    through the heads' gating (for fixed other inputs Q is then affine in the probabilities under
    soft or residual gating, piecewise constant under hard)."""

    # --- prioritized replay and n-step
    prioritized_replay: StrictBool = False
    """Proportional prioritized replay (Schaul et al. 2016)."""
    per_alpha: Fraction = 0.6
    """Priority exponent."""
    per_beta_start: Fraction = 0.4
    """Importance-sampling exponent at the first environment step."""
    per_beta_end: Fraction = 1.0
    """Importance-sampling exponent at the end of the annealing span."""
    per_beta_fraction: Fraction = 1.0
    """Share of total environment steps over which beta is annealed."""
    per_eps: PositiveFloat = 1e-6
    """Added to |TD error| so no transition gets zero priority."""
    n_step: PositiveInt = 1
    """Steps of the multi-step return."""
    action_augmentation: StrictBool = False
    """Also store the transitions of the actions not taken, for environments the agent's actions
    cannot influence (TradingEnv: the same market move with another position and cost). Trains
    every action's value on each step; needs an env with ``counterfactual_transitions``. The
    alternatives are stored as one-step transitions whatever ``n_step`` is (see
    :class:`~foxhunt.replay.NStepAccumulator`)."""

    # --- system
    n_envs: Annotated[int, Strict(), Field(gt=0, le=4096)] = 1
    """Parallel environments stepped together (gymnasium.vector). At most 4096: every one is
    built before the first step, so a slip of the keyboard (a million) would hang there."""
    vector_env: Literal["sync", "async"] = "sync"
    """Vector-env backend; async runs each env in its own process. Where processes start by
    spawning (macOS, Windows), a script that trains with it from Python needs the usual
    ``if __name__ == "__main__":`` guard (the CLI needs nothing)."""
    seed: Seed = 0
    """Seed for Python, NumPy, torch, replay sampling and environments. The vector env seeds its
    sub-env i with ``seed + i`` (as SB3's ``make_vec_env`` and CleanRL do), so runs whose seeds
    differ by less than ``n_envs`` share some sub-envs' episode streams; space seeds ``n_envs``
    apart where the runs' env draws must be independent."""
    device: str = "auto"
    """auto, cpu, cuda, cuda:N or mps."""
    torch_threads: Annotated[int, Strict(), Field(ge=0, le=1024)] = 1
    """Intra-op CPU threads for torch; DQN-sized nets run fastest on one (0: torch default). At
    most 1024: a hundred thousand threads exhausted memory before the first step."""
    mixed_precision: Literal["off", "bf16", "fp16"] = "off"
    """Autocast dtype for the forward pass; fp16 adds a gradient scaler (CUDA)."""
    compile: StrictBool = False
    """torch.compile the learner step. On CPU with Adam/AdamW, one micro-batch per window and no
    mixed precision, the whole step (gradients, clipping, update) is one graph: 1.3x the eager
    step's updates/s at batch 64 and 1.15-1.2x at batch 256 on a 256x256 MLP (BENCHMARKS.md
    section 1). With accumulation (or another optimizer) each micro-batch's gradients are one
    graph; with DDP or mixed precision forward, target and loss are one graph per micro-batch
    with a compiled backward. The first step pays seconds of compiling and needs a C++ compiler
    (without one, training continues eagerly). ``summary.json``'s ``learner_path`` says which
    ran."""
    replay_on_device: StrictBool = False
    """Keep replay storage on the training device (GPU) instead of host memory."""

    # --- evaluation, logging, checkpoints
    eval_interval: NonNegativeInt = 10_000
    """Environment steps between greedy evaluations; 0 disables."""
    eval_episodes: PositiveInt = 10
    """Episodes per greedy evaluation (a new run takes at most 1 000 000; see check_new)."""
    log_interval: PositiveInt = 1_000
    """Environment steps between metrics rows."""
    checkpoint_interval: NonNegativeInt = 0
    """Environment steps between checkpoints; 0 saves only at the end (and on Ctrl-C)."""
    keep_checkpoints: PositiveInt = 3
    """Checkpoints kept on disk."""

    # --- health monitors
    max_consecutive_nonfinite: PositiveInt = 10
    """Stop after this many optimizer steps in a row skipped for non-finite loss or gradients."""
    q_divergence_bound: PositiveFloat | None = None
    """|Q| above this is divergence; None derives it from reward_bound / (1 - gamma) * margin."""
    q_divergence_margin: PositiveFloat = 10.0
    """Safety factor on the theoretical Q bound."""
    reward_bound: PositiveFloat | None = None
    """Largest |reward| expected; None tracks the largest seen so far."""
    q_divergence_policy: Literal["warn", "stop"] = "stop"
    """What to do when Q diverges."""
    grad_collapse_threshold: Annotated[StrictFloat, Field(ge=0.0)] = 1e-10
    """A pre-clip gradient norm below this counts towards gradient collapse."""
    grad_collapse_steps: PositiveInt = 500
    """Optimizer steps in a row below the threshold that make a collapse."""
    grad_collapse_policy: Literal["warn", "stop"] = "warn"
    """What to do on gradient collapse."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**python_scalars(data))
        except ValidationError as err:
            known = type(self).model_fields
            raise ConfigError(_format_validation_error(err, known=known)) from None

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _unquoted_off(cls, value: Any) -> Any:
        """``mixed_precision: off`` unquoted is YAML 1.1's false; 'off' is what it means."""
        return "off" if value is False else value

    @model_validator(mode="after")
    def _cross_field(self) -> DQNHyperparameters:
        eff = self.effective_batch_size
        if eff > self.buffer_capacity:
            raise ValueError(
                f"effective batch size (batch_size * gradient_accumulation_steps = "
                f"{self.batch_size} * {self.gradient_accumulation_steps} = {eff}) must not exceed "
                f"buffer_capacity, got: buffer_capacity={self.buffer_capacity}"
            )
        if self.learning_starts < eff:
            raise ValueError(
                f"learning_starts must be at least the effective batch size {eff} "
                f"(batch_size * gradient_accumulation_steps), got: {self.learning_starts}"
            )
        if self.exploration_final_eps > self.exploration_initial_eps:
            raise ValueError(
                f"exploration_final_eps must not exceed exploration_initial_eps "
                f"({self.exploration_initial_eps}), got: {self.exploration_final_eps}"
            )
        if self.v_min >= self.v_max:
            raise ValueError(f"v_min must be less than v_max ({self.v_max}), got: {self.v_min}")
        if not _DEVICE_RE.match(self.device):
            raise ValueError(
                f"device must be one of auto, cpu, cuda, cuda:N, mps, got: {shown(self.device)}"
            )
        if not self.hidden_sizes:
            raise ValueError("hidden_sizes must name at least one layer, got: ()")
        if self.mixed_precision == "fp16" and self.device in ("cpu", "mps"):
            raise ValueError(
                f"mixed_precision 'fp16' needs a CUDA device, got: device={self.device!r} "
                "(use 'bf16' on CPU)"
            )
        return self

    def check_new(self) -> None:
        """Checks for a new run's settings only: a run directory recorded before them must
        still resume and evaluate (``foxhunt.runs.build_spec`` calls this, ``load_spec`` not).

        A network deeper than 64 layers is a typo that hangs; layers or atoms past 2**31 and a
        noise scale past float32 cannot be built; more evaluation episodes than
        ``foxhunt evaluate --episodes`` takes never end; the C51 support lives in float32, so
        its edges and width must fit there and its atoms must differ.
        """
        if len(self.hidden_sizes) > 64:
            raise ConfigError(
                f"hidden_sizes must name at most 64 layers, got: {len(self.hidden_sizes)} "
                f"({shown(list(self.hidden_sizes))})"
            )
        for name, sizes in (("hidden_sizes", self.hidden_sizes), ("n_atoms", (self.n_atoms,))):
            too_big = [n for n in sizes if n >= 2**31]
            if too_big:  # torch refused 10**30 with a TypeError traceback
                raise ConfigError(f"{name} must be below 2**31, got: {shown(too_big[0])}")
        if self.noisy_nets and self.noisy_sigma0 > float(np.finfo(np.float32).max):
            raise ConfigError(
                f"noisy_sigma0 must fit in float32 (the noisy layers' sigma), got: "
                f"{self.noisy_sigma0!r}"
            )
        if self.eval_episodes > 1_000_000:
            raise ConfigError(f"eval_episodes must be at most 1000000, got: {self.eval_episodes}")
        if self.distributional != "c51":
            return
        f32_max = float(np.finfo(np.float32).max)
        for name, value in (("v_min", self.v_min), ("v_max", self.v_max)):
            if abs(value) > f32_max:
                raise ConfigError(
                    f"{name} must lie within float32's range (+-{f32_max:.4g}) for the "
                    f"C51 support, got: {value!r}"
                )
        with np.errstate(over="ignore"):
            width = np.float32(self.v_max) - np.float32(self.v_min)
        delta = (self.v_max - self.v_min) / (self.n_atoms - 1)
        edge = np.float32(max(abs(self.v_min), abs(self.v_max)))
        if not (np.isfinite(width) and delta > np.spacing(edge)):
            raise ConfigError(
                f"v_min and v_max must leave the {self.n_atoms} C51 atoms finite and distinct "
                f"in float32, got: v_min={self.v_min!r}, v_max={self.v_max!r}"
            )

    # --- derived values
    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step: batch_size * gradient_accumulation_steps."""
        return self.batch_size * self.gradient_accumulation_steps

    @property
    def decays_over_run(self) -> bool:
        """A linear/cosine LR decay whose length is the run's (``lr_decay_steps`` None): the
        trainer plans it from the total, and a new total re-plans it."""
        return self.lr_decay_steps is None and self.lr_schedule in ("linear", "cosine")

    def replace(self, **changes: Any) -> DQNHyperparameters:
        """A validated copy with some fields changed."""
        return type(self)(**{**self.model_dump(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-able values (tuples become lists)."""
        return self.model_dump(mode="json")

    # --- presets ---
    @classmethod
    def conservative(cls, **overrides: Any) -> DQNHyperparameters:
        """Safe defaults: plain double DQN, modest LR, clipping on, no accumulation."""
        base: dict[str, Any] = dict(
            learning_rate=2.5e-4,
            gamma=0.99,
            batch_size=64,
            gradient_accumulation_steps=1,
            max_grad_norm=10.0,
            optimizer="adam",
            loss="huber",
            target_update_interval=1_000,
            tau=1.0,
            double_q=True,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def rainbow(cls, **overrides: Any) -> DQNHyperparameters:
        """Rainbow (Hessel et al. 2018): double + dueling + PER + 3-step + C51 + noisy nets."""
        base: dict[str, Any] = dict(
            double_q=True,
            dueling=True,
            prioritized_replay=True,
            per_alpha=0.5,
            per_beta_start=0.4,
            n_step=3,
            distributional="c51",
            n_atoms=51,
            noisy_nets=True,
            adam_eps=1.5e-4,
            exploration_initial_eps=0.0,
            exploration_final_eps=0.0,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def trading(cls, **overrides: Any) -> DQNHyperparameters:
        """The regime-conditional trading agent trained by ``foxhunt train`` with no arguments."""
        return cls(**{**load_config_dict(_CONFIG_DIR / "trading.yaml"), **overrides})

    @classmethod
    def classic(cls, **overrides: Any) -> DQNHyperparameters:
        """The ``classic`` preset every Gymnasium env trains from: :meth:`cartpole`'s tuned
        configuration, which also solves Acrobot and MountainCar (BENCHMARKS.md §2)."""
        return cls.cartpole(**overrides)

    @classmethod
    def cartpole(cls, **overrides: Any) -> DQNHyperparameters:
        """A configuration that solves CartPole-v1 quickly on a CPU (see configs/cartpole.yaml)."""
        return cls(**{**load_config_dict(_CONFIG_DIR / "cartpole.yaml"), **overrides})

    # --- files ---
    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> DQNHyperparameters:
        """Load a YAML file of hyperparameters (optionally under a ``hyperparameters:`` key)."""
        data = load_config_dict(Path(path))
        # A flat run file (configs/cartpole.yaml) also names its env and step budget: those
        # are the run's (foxhunt.runs.build_spec), not hyperparameters.
        data = {k: v for k, v in data.items() if k not in RUN_KEYS}
        unknown = [k for k in data if k not in cls.model_fields]
        if unknown:
            key = unknown[0]
            raise ConfigError(f"{path}: unknown hyperparameter {key!r} (value {data[key]!r})")
        return cls(**{**data, **overrides})


_CONFIG_DIR = Path(__file__).parent / "presets"


def _yaml_problem(err: yaml.YAMLError) -> str:
    """What a YAML error says is wrong, and where (line and column, 1-based), in one line:
    its first line alone is only the context ("while parsing a flow sequence")."""
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem:
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = getattr(err, "context", None)
        return f"{problem}{where}" + (f" ({context})" if context else "")
    return str(err).splitlines()[0] if str(err) else "invalid YAML"


RUN_KEYS = frozenset({"env", "env_kwargs", "total_env_steps", "market", "trading"})
"""Keys of a run file that belong to the run, not to DQNHyperparameters."""


def load_config_dict(path: Path, *, flatten: bool = True) -> dict[str, Any]:
    """Read a YAML mapping, with errors naming the file.

    With ``flatten`` a sectioned run file yields just its ``hyperparameters`` section.
    """
    if path.is_dir():
        raise ConfigError(f"config file must be a YAML file, got a directory: {path}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=_YamlLoader)
    except DuplicateKeyError as err:
        raise ConfigError(f"config file {path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(err)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    if data is None:
        return {}
    _bounded_yaml(data, f"config file {path}", text)
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of hyperparameters, got: {type(data).__name__}"
        )
    if flatten and "hyperparameters" in data:
        section = data["hyperparameters"] or {}
        if not isinstance(section, dict):
            raise ConfigError(
                f"config file {path}: hyperparameters must be a mapping, got: "
                f"{type(section).__name__}"
            )
        return dict(section)
    return data


_YAML_MAX_VALUES = 100_000
_YAML_MAX_DEPTH = 32


def _bounded_yaml(value: Any, where: str, text: str = "") -> Any:
    """Refuse YAML whose aliases make it endless or huge before anything walks it.

    An alias may name the list that holds it (``&a [*a]``: endless), and nested aliases expand
    a few lines into a billion values (the "billion laughs"); PyYAML builds both in no time,
    but validating them would recurse forever or hang. Without aliases a document holds fewer
    values than characters, so a long plain file (``text``) is never refused.
    """
    limit = max(_YAML_MAX_VALUES, len(text))
    seen = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        node, depth = todo.pop()
        seen += 1
        if seen > limit:
            raise ConfigError(
                f"{where} holds more than {limit:,} values (YAML aliases that expand?)"
            )
        if isinstance(node, dict | list | tuple):
            if depth >= _YAML_MAX_DEPTH:
                raise ConfigError(
                    f"{where} nests lists or mappings more than {_YAML_MAX_DEPTH} deep (a YAML "
                    "alias that refers to itself?)"
                )
            children = node.values() if isinstance(node, dict) else node
            todo.extend((child, depth + 1) for child in children)
    return value


def parse_override(item: str) -> tuple[str, Any]:
    """Parse one ``key=value`` override; the value is YAML (``4``, ``1e-3``, ``[64, 64]``)."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got: {item!r}")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value, got: {item!r}")
    if not raw.strip():
        # An empty value used to mean None, silently disabling e.g. gradient clipping.
        raise ConfigError(
            f"--set {key}= has an empty value; give a value, or {key}=null where the "
            "setting may be unset (max_grad_norm=null: no clipping)"
        )
    try:
        value = yaml.load(raw, Loader=_YamlLoader)
    except yaml.YAMLError as err:
        if raw.lstrip().startswith(("[", "{")):  # meant as a list or mapping, not a string
            raise ConfigError(
                f"--set {key}: value {raw!r} is not valid YAML: {_yaml_problem(err)}"
            ) from None
        value = raw
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be finite, got: {raw!r}")
    return key, _bounded_yaml(value, f"--set {key}", raw)
