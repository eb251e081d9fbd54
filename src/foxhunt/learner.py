"""The optimization step: micro-batch backward, true accumulation, single-pass clipping.

``backward_only`` runs one forward and exactly one backward pass per micro-batch and never steps
the optimizer; gradients add up in ``.grad``. ``optimizer_step`` runs once per accumulation window:
unscale (fp16), measure the global norm, clip once, step, schedule, reset gradients, resample
noise and sync the target. With micro-batch losses scaled by ``len(micro) / effective_batch``
the summed gradient equals the gradient of the mean loss over the whole effective batch, so
``gradient_accumulation_steps`` changes memory use, never the update.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

from foxhunt import losses
from foxhunt.batch import Batch
from foxhunt.config import DQNHyperparameters
from foxhunt.envs.gym_envs import EnvInterface
from foxhunt.errors import ConfigError, first_line
from foxhunt.networks import QNetwork

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GradientStats:
    """What one optimizer step did to the accumulated gradients."""

    pre_clip_norm: float
    """Global L2 norm of the accumulated (unscaled) gradients before clipping."""
    post_clip_norm: float
    """Global L2 norm actually applied (just under max_grad_norm when clipping fired: the scale
    is max_grad_norm / (norm + 1e-6), as in ``torch.nn.utils.clip_grad_norm_``)."""
    clipped: bool
    """Whether clipping scaled the gradients down."""
    lr: float
    """Learning rate used by this step."""
    skipped: bool = False
    """True when gradients were non-finite and the step was skipped."""
    optimizer_steps: int = 0
    """Optimizer steps taken so far (skipped ones excluded)."""


@dataclass
class MicroBatchResult:
    """Detached outputs of one micro-batch backward (tensors: no host sync on the hot path)."""

    loss: torch.Tensor
    td_errors: torch.Tensor
    q_mean: torch.Tensor
    q_abs_max: torch.Tensor


def resolve_device(name: str) -> torch.device:
    """Map ``auto`` to CUDA when present, else CPU; reject devices that are not available."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device must be available, got: {name!r} (no CUDA device found)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device must be available, got: {name!r} (MPS not available)")
    return dev


def lr_factor(hp: DQNHyperparameters, step: int, decay_steps: int | None) -> float:
    """Learning-rate multiplier after ``step`` optimizer steps, a linear/cosine decay lasting
    ``decay_steps`` (the agent's ``lr_decay_steps``; None: not planned yet, nothing has stepped,
    see ``DQNAgent.plan_lr_decay``)."""
    warm = hp.lr_warmup_steps
    if warm and step < warm:
        return (step + 1) / warm
    t = step - warm
    if hp.lr_schedule == "constant":
        return 1.0
    if hp.lr_schedule == "step":
        return hp.lr_step_gamma ** (t // hp.lr_step_size)
    if decay_steps is None:
        return 1.0
    frac = min(1.0, t / decay_steps)
    if hp.lr_schedule == "linear":
        return 1.0 + (hp.lr_final_ratio - 1.0) * frac
    cos = 0.5 * (1.0 + math.cos(math.pi * frac))  # cosine
    return hp.lr_final_ratio + (1.0 - hp.lr_final_ratio) * cos


def build_optimizer(params: list[nn.Parameter], hp: DQNHyperparameters) -> torch.optim.Optimizer:
    """The configured optimizer, with its fastest implementation.

    Adam, AdamW and SGD use the fused kernels (one kernel for every parameter's whole update;
    Adam was 37% of learner time with foreach kernels, see BENCHMARKS.md); RMSprop, which has no
    fused kernel, uses foreach. Both are deterministic, so exact resume is unaffected.
    """
    common: dict[str, Any] = dict(lr=hp.learning_rate, weight_decay=hp.weight_decay)
    if hp.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            params, eps=hp.adam_eps, momentum=hp.momentum, foreach=True, **common
        )
    if hp.optimizer == "sgd":
        cls: type[torch.optim.Optimizer] = torch.optim.SGD
        common["momentum"] = hp.momentum
    else:
        cls = torch.optim.Adam if hp.optimizer == "adam" else torch.optim.AdamW
        common["eps"] = hp.adam_eps
    try:
        return cls(params, fused=True, **common)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device / dtype
        return cls(params, foreach=True, **common)


def _plain_fused_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is fused Adam/AdamW with one group, a float lr, none of amsgrad,
    maximize, capturable or differentiable, and no step hooks: the case whose update foxhunt may
    run itself (the hooks would not run otherwise)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return False
    if len(optimizer.param_groups) != 1:
        return False
    group = optimizer.param_groups[0]
    if not group.get("fused") or isinstance(group["lr"], torch.Tensor):
        return False
    if any(group.get(k) for k in ("amsgrad", "maximize", "capturable", "differentiable")):
        return False
    hooks = (
        getattr(optimizer, "_optimizer_step_pre_hooks", None),
        getattr(optimizer, "_optimizer_step_post_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_post_hooks", None),
    )
    return not any(h is None or len(h) for h in hooks)  # hooks must run: leave it to step()


def _fused_adam_step(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> bool:
    """One Adam/AdamW step with the fused kernel called directly; False when this does not apply.

    ``Optimizer.step`` spends more time on Python bookkeeping (hooks, per-call grouping of
    tensors by device and dtype, state lookups) than the fused kernel spends on a 67k-parameter
    update; calling the kernel directly took the eager learner step at batch 64 from 1.21x to
    1.35x SB3's updates/s (BENCHMARKS.md §1). This is the
    same kernel on the same state tensors, read fresh from ``optimizer.state`` every call (so a
    loaded state dict is used as is), and bit for bit ``optimizer.step()``; tests compare the two.
    The first step, and any configuration outside the plain case, goes through ``step()``.
    """
    if not _plain_fused_adam(optimizer):
        return False
    group = optimizer.param_groups[0]
    state = optimizer.state
    grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
    for p in params:
        st = state.get(p)
        if p.grad is None or not st:
            return False
        grads.append(p.grad)
        exp_avgs.append(st["exp_avg"])
        exp_avg_sqs.append(st["exp_avg_sq"])
        steps.append(st["step"])
    beta1, beta2 = group["betas"]
    decoupled = group.get("decoupled_weight_decay", type(optimizer) is torch.optim.AdamW)
    kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
    torch._foreach_add_(steps, 1)
    try:
        kernel(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            amsgrad=False,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )
    except (RuntimeError, TypeError):  # another torch's kernel signature: leave it to step()
        torch._foreach_sub_(steps, 1)
        raise
    return True


def _fused_kernel_available() -> bool:
    """Whether this torch has the fused Adam/AdamW kernels ``_fused_adam_step`` calls."""
    return hasattr(torch, "_fused_adam_") and hasattr(torch, "_fused_adamw_")


# Batch layouts (size, PER weights or none, discounts or none, hyperparameters) one agent runs
# through each compiled graph; a training run has one or two. Each is a graph of its own, and
# past Dynamo's limit of 8 per function the step would run uncompiled, slower than eager: a
# caller who varies the layout more than this steps the other way for the new layouts.
_GRAPHS_PER_FUNCTION = 4

LEARNER_PATHS = ("whole_step_graph", "compiled_gradients", "compiled_objective", "eager")
"""The ways an update can run (``DQNAgent.learner_path``, summary.json's ``learner_path``)."""


def _objective_inputs(batch: Batch) -> tuple[torch.Tensor | None, ...]:
    """A batch as the objective's positional arguments (the compiled graphs take tensors)."""
    return (
        batch.obs,
        batch.actions,
        batch.rewards,
        batch.next_obs,
        batch.dones,
        batch.discounts,
        batch.weights,
    )


def _own_code(fn: Any) -> Any:
    """``fn`` with a code object of its own, for ``torch.compile``.

    Dynamo keeps its compiled graphs, and its limit of 8 recompilations, per code object, guarded
    on the values a graph holds as constants (hyperparameters, shapes). Agents of different
    configurations in one process (a hyperparameter search) would share one code object, and
    from the ninth configuration on it would run uncompiled: the whole-step graph then ran 3x
    slower than ``compile=False``. A code object per agent keeps each agent's graphs apart and
    frees them with the agent.
    """
    return types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )


class _GraphUnavailable(Exception):
    """A compiled graph (the whole step, or a micro-batch's gradients) failed to compile; the
    step runs the other way."""


class _Objective(nn.Module):
    """The agent's micro-batch objective as a module whose parameters are the online net's, so
    that ``torch.func.functional_call`` can stand ``torch.func.grad``'s inputs in for them."""

    def __init__(self, agent: DQNAgent) -> None:
        super().__init__()
        self.net = agent.online_net
        self._objective = agent._micro_objective  # a bound method, not a registered module

    def forward(self, *batch: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        return self._objective(*batch)


def check_spaces(observation_space: gym.Space, action_space: gym.Space) -> None:
    """Refuse spaces a DQN cannot use, saying how to wrap the env. One check for the agent and
    for the env probe that runs before a run directory is written (CLI, ensembles, hyperopt)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        hint = "DQN picks one of n actions"
        joint = None
        if isinstance(action_space, gym.spaces.MultiDiscrete):
            joint = math.prod(int(n) for n in action_space.nvec.flat)  # no int64 overflow
        elif isinstance(action_space, gym.spaces.MultiBinary):
            joint = 2 ** math.prod(action_space.shape)
        if joint is not None:
            hint += (
                f": wrap the env so that its actions are the {joint} joint choices, "
                f"Discrete({joint})"
            )
        raise ConfigError(f"action space must be Discrete, got: {action_space} ({hint})")
    if not isinstance(observation_space, gym.spaces.Box):
        hint = (
            "pass the env id, or wrap it in foxhunt.envs.gym_envs.OneHotObservation"
            if isinstance(observation_space, gym.spaces.Discrete)
            else "flatten it with gymnasium.wrappers.FlattenObservation"
        )
        raise ConfigError(
            f"observation space must be a Box (or Discrete), got: {observation_space} ({hint})"
        )
    if not observation_space.shape:
        raise ConfigError(
            f"observation space must have at least one dimension, got: {observation_space} "
            "(reshape the observation to (1,))"
        )
    if math.prod(observation_space.shape) == 0:  # no inputs: one constant Q per action
        raise ConfigError(
            f"observation space must hold at least one value, got: {observation_space}"
        )


class DQNAgent:
    """Online and target Q-networks, optimizer, LR scheduler and the exact optimization step."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hyperparameters: DQNHyperparameters,
        *,
        n_regimes: int = 0,
    ) -> None:
        check_spaces(observation_space, action_space)
        if int(action_space.n) == 1:
            log.warning(
                "the action space holds one action (Discrete(1)): every policy is the same and "
                "there is nothing to learn"
            )
        hp = hyperparameters
        self.hp = hp
        self.device = resolve_device(hp.device)
        if hp.mixed_precision == "fp16" and self.device.type != "cuda":
            # device=auto resolved to a machine without CUDA: the same refusal as device=cpu.
            raise ConfigError(
                f"mixed_precision 'fp16' needs a CUDA device, got: device={hp.device!r} "
                f"(resolved to {self.device.type}; use 'bf16' on CPU)"
            )
        self.n_actions = int(action_space.n)
        self.obs_shape = tuple(int(d) for d in observation_space.shape)
        self.obs_dim = int(np.prod(self.obs_shape))
        if hp.regime_conditional and n_regimes < 1:
            raise ConfigError(
                "regime_conditional must be false for an environment without regimes, got: true "
                "(the environment reports no n_regimes)"
            )
        # Initialise from the run's seed without disturbing the global torch RNG: the same
        # hyperparameters always give the same starting weights, in any process or rank.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(hp.seed)
            net = QNetwork(self.obs_dim, self.n_actions, hp, n_regimes, self.obs_shape)
        self.online_net = net.to(self.device)
        self.target_net = copy.deepcopy(self.online_net)
        self.target_net.requires_grad_(False)
        self.noise_generator = torch.Generator().manual_seed(hp.seed + 7919)
        if self.online_net.is_noisy:
            self.online_net.reset_noise(self.noise_generator)
            self.target_net.reset_noise(self.noise_generator)
        self.params = [p for p in self.online_net.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, hp)
        self._fast_adam = _fused_kernel_available()
        self._clip_coef = (
            torch.zeros((), dtype=torch.float32) if self.device.type == "cpu" else None
        )
        self.lr_decay_steps: int | None = hp.lr_decay_steps
        """The linear/cosine decay's length in optimizer steps: the hyperparameter's, or with
        None the run's, which ``DQNTrainer.learn`` sets from its total."""
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(hp, step, self.lr_decay_steps)
        )
        self.autocast_dtype = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[
            hp.mixed_precision
        ]
        self.scaler = (
            torch.amp.GradScaler(self.device.type) if hp.mixed_precision == "fp16" else None
        )
        self.rng = np.random.default_rng(hp.seed + 104729)
        self.env_interface = EnvInterface()  # set by the trainer, saved with the model
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self._forward_net: nn.Module = self.online_net
        self._ddp: nn.Module | None = None
        self._objective = self._build_objective()
        self._baked: tuple[Any, ...] = ()
        self._whole_step_keys: set[tuple[Any, ...]] = set()  # non-empty once it has run
        self._scale = torch.zeros((), dtype=torch.float32, device=self.device)
        self._grad_graph_keys: set[tuple[Any, ...]] = set()
        self._gradients = self._functional_gradients()
        self._grad_graph = self._build_grad_graph()
        self.graph_steps = 0
        """Optimizer steps (skipped ones included) this process ran as one compiled graph."""
        self.learner_path: str | None = None
        """How the last update ran: ``whole_step_graph``, ``compiled_gradients`` (a graph per
        micro-batch, then ``optimizer_step``), ``compiled_objective`` or ``eager``."""
        self._whole_step = self._build_whole_step()

    # --- data parallel
    def enable_data_parallel(self, **ddp_kwargs: Any) -> None:
        """Wrap the online net in DistributedDataParallel (call after init_process_group).

        Micro-batches other than the last of each window run under ``no_sync`` so gradients are
        all-reduced once per optimizer step, not once per micro-batch.
        """
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Noise is drawn from identically seeded generators on every rank, so buffers need no
        # broadcast on each forward.
        params = inspect.signature(DDP.__init__).parameters
        key = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
        ddp_kwargs.setdefault(key, False)
        self._ddp = DDP(self.online_net, **ddp_kwargs)
        self._forward_net = self._ddp
        self._objective = self._build_objective()

    def _sync_context(self, sync: bool) -> contextlib.AbstractContextManager[Any]:
        if self._ddp is not None and not sync:
            return self._ddp.no_sync()  # type: ignore[operator]
        return contextlib.nullcontext()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # --- loss
    def compute_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-sample loss, TD errors (priority signal) and Q(s, a) of the taken actions."""
        hp = self.hp
        discounts = (
            batch.discounts
            if batch.discounts is not None
            else torch.full_like(batch.rewards, hp.gamma)
        )
        with self._autocast():
            out = self._forward_net(batch.obs)
        net = self.online_net
        actions = batch.actions.long()
        with torch.no_grad():
            next_target = self.target_net(batch.next_obs)
            if hp.double_q:
                with self._autocast():
                    # The bare module, not the DDP wrapper: this pass needs no gradient sync.
                    next_online = self.online_net(batch.next_obs)
                next_actions = net.q_values(next_online).argmax(dim=1)
            else:
                next_actions = net.q_values(next_target).argmax(dim=1)
            next_taken = _take(next_target.float(), next_actions)
        taken = _take(out.float(), actions)
        if hp.distributional == "none":
            with torch.no_grad():
                target = losses.td_target(batch.rewards, discounts, batch.dones, next_taken)
            loss, td = losses.scalar_td_loss(taken, target, hp.loss, hp.huber_delta)
            q_taken = taken.detach()
        elif hp.distributional == "c51":
            with torch.no_grad():
                target = losses.categorical_projection(
                    next_taken.softmax(dim=-1), batch.rewards, discounts, batch.dones, net.support
                )
            loss, td = losses.categorical_loss(taken, target)
            q_taken = (taken.detach().softmax(dim=-1) * net.support).sum(dim=-1)
        else:
            with torch.no_grad():
                target = losses.td_target(
                    batch.rewards[:, None], discounts[:, None], batch.dones[:, None], next_taken
                )
            loss, td = losses.quantile_huber_loss(taken, target, hp.huber_delta)
            q_taken = taken.detach().mean(dim=-1)
        return loss, td.detach(), q_taken

    def _micro_objective(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_obs: torch.Tensor,
        dones: torch.Tensor,
        discounts: torch.Tensor | None,
        weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        """Everything between the sampled tensors and ``backward``: the unit of ``compile``."""
        batch = Batch(obs, actions, rewards, next_obs, dones, discounts, weights)
        per_sample, td, q_taken = self.compute_loss(batch)
        weighted = per_sample if weights is None else per_sample * weights
        loss = weighted.mean()
        # A non-finite loss can have finite gradients (Huber's gradient is bounded, so an
        # infinite target still gives a finite step): turn it into NaN gradients so the window
        # is skipped, on every data-parallel rank alike. Multiplying by 1.0 is exact.
        objective = loss * torch.where(torch.isfinite(loss.detach()), 1.0, math.nan)
        return objective, loss.detach(), td, q_taken.mean(), q_taken.abs().max()

    def _build_objective(self):  # type: ignore[no-untyped-def]
        """The eager objective, or with ``compile`` one torch.compile graph of the whole
        forward + target + loss (its backward compiled by AOTAutograd): fewer kernel launches,
        which is what bounds DQN-sized networks. Replaced when DDP wraps the network."""
        self._compile_ok = False
        self._objective_compiled = bool(self.hp.compile)
        if not self.hp.compile:
            return self._micro_objective
        # Static shapes: an accumulation window has at most two micro-batch sizes.
        objective = types.MethodType(_own_code(type(self)._micro_objective), self)
        return torch.compile(objective, dynamic=False)

    def _objective_backward(self, batch: Batch, scale: float) -> tuple[torch.Tensor, ...]:
        objective, *outs = self._objective(*_objective_inputs(batch))
        # A window of one micro-batch has scale 1: multiplying by 1.0 is exact, so skipping it
        # changes no bit and saves an autograd node and its kernels outside the compiled graph.
        scaled = objective if scale == 1.0 else objective * scale
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        scaled.backward()
        return tuple(outs)

    def _first_compiled_backward(self, batch: Batch, scale: float) -> tuple[torch.Tensor, ...]:
        """The first compiled call compiles the forward, its backward compiles lazily: a machine
        that lacks what inductor needs (a C++ compiler) falls back to eager, gradients intact."""
        saved = [None if p.grad is None else p.grad.clone() for p in self.params]
        try:
            outs = self._objective_backward(batch, scale)
        except Exception as exc:  # any compiler failure falls back alike
            log.warning(
                "compile: torch.compile failed (%s); training continues eagerly", first_line(exc)
            )
            for p, g in zip(self.params, saved, strict=True):
                p.grad = g
            self._objective = self._micro_objective
            self._objective_compiled = False
            return self._objective_backward(batch, scale)
        self._compile_ok = True
        return outs

    # --- the optimization step
    def backward_micro_batch(
        self, batch: Batch, scale: float, *, sync: bool = True
    ) -> MicroBatchResult:
        """Forward, loss * scale, exactly one backward pass; no optimizer step, no host sync.

        ``scale`` is ``len(batch) / effective_batch_size``: the micro-batch mean times it sums to
        the mean over the window. Importance weights, when present, were normalised over the whole
        window by the replay buffer, so they need no further care here.
        """
        if not self.online_net.training:
            self.online_net.train()
        if self._grad_graph_usable(batch):
            try:
                return self._run_grad_graph(batch, scale)
            except _GraphUnavailable:
                pass
        with self._sync_context(sync):
            if self._objective is self._micro_objective or self._compile_ok:
                loss, td, q_mean, q_abs_max = self._objective_backward(batch, scale)
            else:
                loss, td, q_mean, q_abs_max = self._first_compiled_backward(batch, scale)
        self.learner_path = "compiled_objective" if self._objective_compiled else "eager"
        return MicroBatchResult(loss, td, q_mean, q_abs_max)

    def backward_only(self, batch: Batch, scale: float = 1.0, *, sync: bool = True) -> float:
        """Accumulate ``scale * loss(batch)`` gradients with one backward pass; return the loss."""
        return float(self.backward_micro_batch(batch, scale, sync=sync).loss)

    def optimizer_step(self) -> GradientStats:
        """Clip once by global norm, step, schedule, reset gradients (to None), resample noise.

        Non-finite gradients skip the step: parameters, optimizer and scheduler are untouched, the
        gradients are dropped and the stats say ``skipped``.
        """
        hp = self.hp
        self._require_decay_length()
        lr = float(self.optimizer.param_groups[0]["lr"])
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            raise RuntimeError("optimizer_step called with no accumulated gradients")
        # get_total_norm's maths without its per-call grouping by device and dtype: every
        # gradient here shares the parameters' one device and dtype.
        pre = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        pre_f = float(pre)  # the one host sync per step: decides skip vs step
        if not math.isfinite(pre_f):
            if self.scaler is not None:
                self.scaler.update()  # lowers the loss scale; no optimizer state is touched
            return self._skipped_step(pre_f, lr)
        clipped = False
        post_f = pre_f
        if hp.max_grad_norm is not None:
            # The same coefficient as torch.nn.utils.clip_grad_norm_, min(1, max / (norm + 1e-6)),
            # applied to the gradients of the one backward pass. The norm is already on the host
            # (for the skip decision), so clipping is one scalar multiply and only when it fires.
            coef = _clip_coefficient(pre_f, hp.max_grad_norm)
            if coef < 1.0:
                clipped = True
                if self._clip_coef is not None:
                    # On CPU, _foreach_mul_ by a 0-dim tensor measured 6 us against 14 us by a
                    # Python float for 67k parameters (BENCHMARKS.md §3); the coefficient is
                    # float32 either way, so the gradients are the same bits.
                    torch._foreach_mul_(grads, self._clip_coef.fill_(coef))
                else:
                    torch._foreach_mul_(grads, coef)
            post_f = pre_f * coef
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif not self._fused_step():
            self.optimizer.step()
        return self._finished_step(pre_f, post_f, clipped, lr)

    def _skipped_step(self, pre_f: float, lr: float) -> GradientStats:
        """Non-finite gradients: drop them; parameters, optimizer and schedule stay as they were."""
        self.zero_grad()
        self.skipped_steps += 1
        self.consecutive_skips += 1
        return GradientStats(pre_f, float("nan"), False, lr, True, self.optimizer_steps)

    def _finished_step(
        self, pre_f: float, post_f: float, clipped: bool, lr: float
    ) -> GradientStats:
        """After the parameters moved: schedule, reset gradients, resample noise, sync target."""
        # What Optimizer.step's wrapper records for the scheduler, also when the kernel ran
        # without it (the direct fused call, the whole-step graph): the step did happen.
        self.optimizer._opt_called = True  # type: ignore[attr-defined]
        self.scheduler.step()
        self.zero_grad()
        self.optimizer_steps += 1
        self.consecutive_skips = 0
        if self.online_net.is_noisy:
            self.online_net.reset_noise(self.noise_generator)
            self.target_net.reset_noise(self.noise_generator)
        if self.optimizer_steps % self.hp.target_update_interval == 0:
            self.sync_target()
        return GradientStats(pre_f, post_f, clipped, lr, False, self.optimizer_steps)

    def plan_lr_decay(self, updates: int) -> None:
        """With ``lr_decay_steps`` None: make the linear/cosine decay end at the last of a run's
        ``updates`` optimizer steps (counted from the start of training, so a resume with the
        same total continues the same schedule). The next step's rate follows at once."""
        if not self.hp.decays_over_run:
            return
        length = self._decay_length(updates)
        if length == self.lr_decay_steps:
            return
        self.lr_decay_steps = length
        rates = [self.planned_rate(updates)]  # LambdaLR's own expression: base * factor
        self.optimizer.param_groups[0]["lr"] = rates[0]
        self.scheduler._last_lr = rates  # type: ignore[attr-defined]

    def planned_rate(self, updates: int) -> float:
        """The next optimizer step's learning rate were the run's decay planned over
        ``updates`` optimizer steps (what :meth:`plan_lr_decay` would set)."""
        sched = self.scheduler
        return sched.base_lrs[0] * lr_factor(self.hp, sched.last_epoch, self._decay_length(updates))

    def _decay_length(self, updates: int) -> int:
        return max(1, updates - 1 - self.hp.lr_warmup_steps)

    def _require_decay_length(self) -> None:
        """Before a step: a decay over "the run" needs the run's length, which a trainer gives
        (an agent stepped by the user's own loop has none)."""
        if self.hp.decays_over_run and self.lr_decay_steps is None:
            raise ConfigError(
                f"lr_decay_steps must be set to step an agent outside DQNTrainer.learn with "
                f"lr_schedule={self.hp.lr_schedule!r}, got: None (None means the run's length, "
                "which learn(total) plans)"
            )

    # --- one compiled graph for the whole step
    def update(self, batch: Batch) -> tuple[MicroBatchResult, GradientStats]:
        """One optimizer step on a window of one micro-batch: ``backward_micro_batch`` then
        ``optimizer_step``, or, with ``compile`` on CPU and plain Adam/AdamW, both in one
        compiled graph (gradients by ``torch.func.grad``, the global norm, clipping, the Adam
        update and the skip of a non-finite step traced together). That graph has none of the
        per-step cost of the autograd engine, the compiled backward's wrappers, a second graph
        call and the optimizer's kernels, which is most of what a DQN-sized step spends beside
        its matrix products (BENCHMARKS.md section 1). Same maths to float round-off; tests
        compare it with the eager step."""
        if self._whole_step_usable(batch):
            try:
                return self._run_whole_step(batch)
            except _GraphUnavailable:
                pass
        result = self.backward_micro_batch(batch, 1.0, sync=True)
        return result, self.optimizer_step()

    def _graph_key(self, batch: Batch) -> tuple[Any, ...]:
        """What makes Dynamo trace a graph again: the batch's layout and the hyperparameters the
        objective reads."""
        return (len(batch), batch.weights is None, batch.discounts is None, id(self.hp))

    def _graphs_apply(self, keys: set[tuple[Any, ...]], batch: Batch | None) -> bool:
        """Whether a compiled graph with these traced ``keys`` may take ``batch``: each layout is
        a graph of its own (a few, not one per call), and DDP's gradient hooks and autocast need
        the autograd path."""
        if batch is not None:
            key = self._graph_key(batch)
            if key not in keys and len(keys) >= _GRAPHS_PER_FUNCTION:
                return False
        return self._ddp is None and self.scaler is None and self.autocast_dtype is None

    def _whole_step_usable(self, batch: Batch | None = None) -> bool:
        if self._whole_step is None or not self._graphs_apply(self._whole_step_keys, batch):
            return False
        if not _plain_fused_adam(self.optimizer) or self._traced_constants() != self._baked:
            return False  # another optimizer, or constants changed since the graph was traced
        return all(p.grad is None for p in self.params)  # nothing accumulated outside it

    def _traced_constants(self) -> tuple[Any, ...]:
        """What the whole-step graph holds as constants: the optimizer's and the clip's."""
        group = self.optimizer.param_groups[0]
        return (
            *group["betas"],
            group["eps"],
            group["weight_decay"],
            type(self.optimizer),
            self.hp.max_grad_norm,
        )

    def _functional_gradients(self):  # type: ignore[no-untyped-def]
        """``gradients(params, scale, batch)``: the objective's gradients (times ``scale``, unless
        None) by ``torch.func.grad``, with ``functional_call`` standing the traced parameters in
        for the network's, and its other outputs; the body both compiled graphs trace. None
        where they do not apply (no ``compile``; GPU, untested here)."""
        if not (self.hp.compile and self.device.type == "cpu" and hasattr(torch, "func")):
            return None
        module = _Objective(self)
        names = [f"net.{n}" for n, p in self.online_net.named_parameters() if p.requires_grad]

        def gradients(
            params: list[torch.Tensor],
            scale: torch.Tensor | None,
            batch: tuple[torch.Tensor | None, ...],
        ) -> tuple[Any, ...]:
            def objective(ps: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Any]:
                out = torch.func.functional_call(module, dict(zip(names, ps, strict=True)), batch)
                return (out[0] if scale is None else out[0] * scale), out[1:]

            return torch.func.grad(objective, has_aux=True)(tuple(params))

        return gradients

    def _build_whole_step(self):  # type: ignore[no-untyped-def]
        """The compiled whole-step function, or None where it does not apply."""
        gradients = self._gradients
        if gradients is None or not _plain_fused_adam(self.optimizer):
            return None
        group = self.optimizer.param_groups[0]
        self._baked = self._traced_constants()
        beta1, beta2 = (float(b) for b in group["betas"])
        eps, wd = float(group["eps"]), float(group["weight_decay"])
        decoupled = bool(
            group.get("decoupled_weight_decay", type(self.optimizer) is torch.optim.AdamW)
        )
        max_norm = self.hp.max_grad_norm

        def whole_step(
            params: list[torch.Tensor],
            exp_avgs: list[torch.Tensor],
            exp_avg_sqs: list[torch.Tensor],
            steps: list[torch.Tensor],
            scalars: torch.Tensor,
            *batch: torch.Tensor | None,
        ) -> tuple[torch.Tensor, ...]:
            grads, (loss, td, q_mean, q_abs_max) = gradients(params, None, batch)
            # Optimizer.step's maths: clip_grad_norm_'s norm and coefficient, then the fused
            # Adam/AdamW kernel's update with its host scalars (``_whole_step_scalars``).
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads])
            )
            finite = torch.isfinite(norm)
            coef = None
            if max_norm is not None:
                coef = ((norm + 1e-6).reciprocal() * max_norm).clamp(max=1.0)
            step_size, bc2_sqrt, decay = scalars[0], scalars[1], scalars[2]
            for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True):
                if coef is not None:
                    g = g * coef
                if wd and not decoupled:
                    g = g + wd * p
                p_new = p - decay * p if wd and decoupled else p
                m_new = m.lerp(g, 1.0 - beta1)
                v_new = v * beta2 + (1.0 - beta2) * g * g
                p_new = p_new - step_size * m_new / (v_new.sqrt() / bc2_sqrt + eps)
                # A non-finite norm leaves every tensor as it was (the step is skipped).
                p.copy_(torch.where(finite, p_new, p))
                m.copy_(torch.where(finite, m_new, m))
                v.copy_(torch.where(finite, v_new, v))
                s.copy_(torch.where(finite, s + 1, s))
            # coef and finite are returned only so that inductor computes them once into
            # buffers: inlined, their scalar maths ran again in every vector iteration of the
            # update kernel (46 us against 35 us per step at 67k parameters).
            return norm, loss, td, q_mean, q_abs_max, coef, finite

        # Static shapes: one graph per batch layout (a run has one or two; _GRAPHS_PER_FUNCTION).
        return torch.compile(_own_code(whole_step), dynamic=False)

    def _run_whole_step(self, batch: Batch) -> tuple[MicroBatchResult, GradientStats]:
        self._require_decay_length()
        if not self.online_net.training:
            self.online_net.train()
        state = self.optimizer.state
        group = self.optimizer.param_groups[0]
        lr = float(group["lr"])
        if any(not state.get(p) for p in self.params):
            self._init_adam_state()
        sts = [state[p] for p in self.params]
        args = (
            self.params,
            [st["exp_avg"] for st in sts],
            [st["exp_avg_sq"] for st in sts],
            [st["step"] for st in sts],
            self._whole_step_scalars(sts[0]["step"], lr),
            *_objective_inputs(batch),
        )
        if self._whole_step_keys:
            with torch.no_grad():
                norm, loss, td, q_mean, q_abs_max, *_ = self._whole_step(*args)
        else:
            norm, loss, td, q_mean, q_abs_max, *_ = self._first_whole_step(args)
        self._whole_step_keys.add(self._graph_key(batch))
        self.graph_steps += 1
        self.learner_path = "whole_step_graph"
        result = MicroBatchResult(loss, td, q_mean, q_abs_max)
        pre_f = float(norm)  # the one host sync per step: decides skip vs step
        if not math.isfinite(pre_f):
            return result, self._skipped_step(pre_f, lr)
        max_norm = self.hp.max_grad_norm
        coef = 1.0 if max_norm is None else _clip_coefficient(pre_f, max_norm)
        return result, self._finished_step(pre_f, pre_f * coef, coef < 1.0, lr)

    # --- one compiled graph for a micro-batch's gradients (accumulation windows)
    def _build_grad_graph(self):  # type: ignore[no-untyped-def]
        """A compiled function from a micro-batch to its scaled gradients, or None where it does
        not apply. A window of several micro-batches calls it once per micro-batch (so only one
        micro-batch's activations are alive at a time), adds the gradients up in ``.grad`` and
        then steps with ``optimizer_step``: the autograd engine and the compiled backward's
        wrappers drop out of every micro-batch (4 x 64 on a 256x256 MLP: 3.0 ms against 3.7 ms
        a window with the compiled objective)."""
        gradients = self._gradients
        if gradients is None:
            return None

        def micro_batch_gradients(
            params: list[torch.Tensor], scale: torch.Tensor, *batch: torch.Tensor | None
        ) -> tuple[Any, ...]:
            return gradients(params, scale, batch)

        return torch.compile(_own_code(micro_batch_gradients), dynamic=False)

    def _grad_graph_usable(self, batch: Batch) -> bool:
        return self._grad_graph is not None and self._graphs_apply(self._grad_graph_keys, batch)

    def _run_grad_graph(self, batch: Batch, scale: float) -> MicroBatchResult:
        args = (self.params, self._scale.fill_(scale), *_objective_inputs(batch))
        try:
            with torch.no_grad():
                grads, (loss, td, q_mean, q_abs_max) = self._grad_graph(*args)
        except Exception as exc:
            if self._grad_graph_keys:
                raise  # it ran before: a real error, not a compiler's
            log.warning(
                "compile: the gradient graph failed (%s); using the compiled objective instead",
                first_line(exc),
            )
            self._grad_graph = None
            raise _GraphUnavailable from exc
        self._grad_graph_keys.add(self._graph_key(batch))
        # Added up in .grad as AccumulateGrad would: the first micro-batch's become .grad.
        held = [p for p in self.params if p.grad is not None]
        if not held:
            for p, g in zip(self.params, grads, strict=True):
                p.grad = g
        elif len(held) == len(self.params):
            torch._foreach_add_([p.grad for p in self.params], list(grads))
        else:
            for p, g in zip(self.params, grads, strict=True):
                p.grad = g if p.grad is None else p.grad.add_(g)
        self.learner_path = "compiled_gradients"
        return MicroBatchResult(loss, td, q_mean, q_abs_max)

    def _whole_step_scalars(self, step: torch.Tensor, lr: float) -> torch.Tensor:
        """The fused Adam kernel's per-step scalars, computed on the host in float64 as it does:
        step size ``lr / (1 - beta1^t)``, ``sqrt(1 - beta2^t)``, and AdamW's ``lr * decay``. Every
        parameter of the one group steps together, so the first one's count serves all."""
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        t = float(step) + 1.0
        scalars = [lr / (1.0 - beta1**t), math.sqrt(1.0 - beta2**t), lr * group["weight_decay"]]
        return torch.tensor(scalars, dtype=torch.float32, device=self.device)

    def _first_whole_step(self, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        """Compile on the first call; where it fails, say so once and step as before. The tensors
        it updates in place are restored, so a failure part-way leaves no trace."""
        tensors = [t for group in args[:4] for t in group]
        saved = [t.detach().clone() for t in tensors]
        try:
            with torch.no_grad():
                outs = self._whole_step(*args)
        except Exception as exc:  # any compiler failure falls back alike
            with torch.no_grad():
                for t, v in zip(tensors, saved, strict=True):
                    t.copy_(v)
            log.warning(
                "compile: the whole-step graph failed (%s); stepping with the compiled "
                "objective and the optimizer instead",
                first_line(exc),
            )
            self._whole_step = None
            raise _GraphUnavailable from exc
        return outs

    def _init_adam_state(self) -> None:
        """Adam's lazy state, as its first ``step()`` would create it for fused kernels."""
        for p in self.params:
            st = self.optimizer.state[p]
            if not st:
                st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _fused_step(self) -> bool:
        if not self._fast_adam:
            return False
        try:
            return _fused_adam_step(self.optimizer, self.params)
        except (RuntimeError, TypeError) as exc:
            log.debug("direct fused Adam step unavailable (%s); using Optimizer.step", exc)
            self._fast_adam = False
            return False

    def zero_grad(self) -> None:
        """Drop accumulated gradients (set to None, so no memory is held between windows)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def sync_target(self, tau: float | None = None) -> None:
        """Hard copy (tau = 1) or Polyak average of the online parameters into the target's."""
        tau = self.hp.tau if tau is None else tau
        online = list(self.online_net.parameters())
        target = list(self.target_net.parameters())
        if tau >= 1.0:
            torch._foreach_copy_(target, online)
        else:
            torch._foreach_lerp_(target, online, tau)
        # Buffers (noise samples, the C51 support) are not synced: the target draws its own noise.

    # --- acting
    def _as_batch(self, obs: np.ndarray) -> tuple[np.ndarray, bool]:
        """(a batch of observations, whether ``obs`` was a single one), judged by the env's
        observation shape, not by the number of dimensions (an image is one observation)."""
        try:
            arr = np.asarray(obs, dtype=np.float32)
        except (TypeError, ValueError):
            reset = " (env.reset() returns (obs, info): pass obs)" if isinstance(obs, tuple) else ""
            raise ValueError(
                f"observation must be an array of numbers of shape {self.obs_shape} (one) or a "
                f"batch of them, got: {type(obs).__name__}{reset}"
            ) from None
        if arr.shape == self.obs_shape:
            return arr[None], True
        if arr.shape[1:] == self.obs_shape:
            return arr, False
        one = ", ".join(map(str, self.obs_shape))
        hint = (
            " (the network sees a Discrete observation one-hot encoded; predict() takes the "
            "env's own observation)"
            if arr.ndim == 0 and self.env_interface.one_hot is not None
            else ""
        )
        raise ValueError(
            f"observation must have shape {self.obs_shape} (one) or (n, {one}) (a batch), "
            f"got: {arr.shape}{hint}"
        )

    def greedy_actions(self, obs: np.ndarray) -> np.ndarray:
        """argmax_a Q(obs, a) for a batch of observations (or one, as a batch of one)."""
        return self._greedy(self._as_batch(obs)[0])

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """``[B, A]`` expected Q-values (float32) for a batch of observations (or one, as a
        batch of one): what :meth:`greedy_actions` takes the argmax of."""
        return self._q(self._as_batch(obs)[0]).float().cpu().numpy()

    @torch.inference_mode()
    def _q(self, batch: np.ndarray) -> torch.Tensor:
        """The online network's expected Q for a batch already checked by ``_as_batch``."""
        x = torch.as_tensor(batch, dtype=torch.float32, device=self.device)
        return self.online_net.q_values(self.online_net(x))

    def _greedy(self, batch: np.ndarray) -> np.ndarray:
        """argmax_a Q for a batch already checked by ``_as_batch``."""
        return self._q(batch).argmax(dim=1).cpu().numpy()

    def act(self, obs: np.ndarray, epsilon: float = 0.0) -> np.ndarray | int:
        """Epsilon-greedy actions for a batch (or one observation, returning an int)."""
        batch, single = self._as_batch(obs)
        if epsilon <= 0.0:
            greedy = self._greedy(batch)
            return int(greedy[0]) if single else greedy
        n = len(batch)
        # The same draws in the same order as deciding after the forward pass, so the actions
        # are too; but when every env explores (most steps while epsilon is near 1) the network
        # is not run at all.
        explore = self.rng.random(n) < epsilon
        randoms = self.rng.integers(0, self.n_actions, size=n) if explore.any() else None
        if randoms is not None and explore.all():
            actions = randoms
        else:
            greedy = self._greedy(batch)
            actions = greedy if randoms is None else np.where(explore, randoms, greedy)
        return int(actions[0]) if single else actions

    def predict(self, observation: Any) -> np.ndarray | int:
        """The greedy action in the env's own terms, for one observation (an int back) or a
        batch: a Discrete observation is the env's state index, not the network's one-hot vector,
        and the action is the env's (``Discrete(n, start)`` counts from ``start``). Noise is off.
        ``act`` is the network's view, which the training loop uses."""
        batch, single = self._as_batch(self.env_interface.observations(observation))
        noise_off = self.evaluation() if self.online_net.training else contextlib.nullcontext()
        with noise_off:
            actions = self.env_interface.actions(self._greedy(batch))
        return int(actions[0]) if single else actions

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Noise off (mean weights) for deterministic greedy evaluation."""
        self.online_net.eval()
        try:
            yield
        finally:
            self.online_net.train()


def _clip_coefficient(norm: float, max_norm: float) -> float:
    """``clip_grad_norm_``'s coefficient, ``min(1, max_norm / (norm + 1e-6))``, rounded the way
    its float32 tensor maths rounds it (``(norm + 1e-6).reciprocal() * max_norm``), so the clipped
    gradients are bit for bit torch's while the host scalar saves three kernel launches."""
    if max_norm > _FLOAT32_MAX:  # inf in float32, so torch never clips (norm is finite here)
        return 1.0
    f32 = np.float32
    coef = (f32(1.0) / (f32(norm) + f32(1e-6))) * f32(max_norm)
    return min(1.0, float(coef))


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _take(values: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Select ``values[i, actions[i]]`` for ``[B, A]`` or ``[B, A, N]`` tensors."""
    if values.dim() == 2:
        return values.gather(1, actions[:, None]).squeeze(1)
    idx = actions[:, None, None].expand(-1, 1, values.shape[-1])
    return values.gather(1, idx).squeeze(1)
