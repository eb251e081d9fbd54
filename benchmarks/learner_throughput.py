"""Learner throughput: foxhunt's optimizer step vs Stable-Baselines3's DQN.train, updates/s.

Both sides run the same update on the same data: an MLP 256x256 Q-network on CartPole-v1
observations, Huber loss (delta 1), global-norm clipping at 10, Adam, one torch thread, and replay
sampling included in every update (SB3's ``train`` samples inside its loop; foxhunt's
``DQNTrainer.train_step`` does too). Both replays are filled with the same random transitions.
SB3's DQN is plain (not double) DQN, so the headline ratio uses foxhunt with ``double_q=False``;
foxhunt's default double DQN (one more forward pass) is reported beside it. ``torch_minimal`` is a
hand-written loop of the same maths with no bookkeeping at all: the floor any library could reach.
``foxhunt_compiled`` is foxhunt with ``compile=True``: on CPU with Adam, the whole step (gradients,
clipping, update) as one graph, ``DQNAgent.update``; the JSON records whether it ran that way.
``cleanrl`` is CleanRL's ``dqn.py`` update as written (SB3's ``ReplayBuffer.sample``, MSE TD loss,
no clipping, ``zero_grad`` / ``backward`` / ``step``) on the same network, against foxhunt set to
the same update (``loss="mse"``, no clipping, plain DQN).

Run: ``python benchmarks/learner_throughput.py [--smoke] [--out FILE.json] [--profile]``
"""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

OBS_DIM, N_ACTIONS, GAMMA, LR, MAX_NORM = 4, 2, 0.99, 1e-4, 10.0
HIDDEN = (256, 256)


def random_transitions(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The replay content both sides get: CartPole-shaped random transitions."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, OBS_DIM)).astype(np.float32),
        "next_obs": rng.standard_normal((n, OBS_DIM)).astype(np.float32),
        "actions": rng.integers(0, N_ACTIONS, size=n).astype(np.int64),
        "rewards": rng.standard_normal(n).astype(np.float32),
        "dones": (rng.random(n) < 0.05).astype(np.float32),
    }


def make_foxhunt(
    batch: int,
    data: dict[str, np.ndarray],
    double_q: bool,
    compile: bool = False,
    mixed_precision: str = "off",
    cleanrl_update: bool = False,
) -> Any:
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    n = len(data["actions"])
    hp = DQNHyperparameters(
        learning_rate=LR,
        gamma=GAMMA,
        batch_size=batch,
        buffer_capacity=n,
        learning_starts=batch,
        max_grad_norm=None if cleanrl_update else MAX_NORM,
        loss="mse" if cleanrl_update else "huber",
        huber_delta=1.0,
        optimizer="adam",
        hidden_sizes=HIDDEN,
        double_q=double_q,
        compile=compile,
        mixed_precision=mixed_precision,
        target_update_interval=10**9,
        device="cpu",
        torch_threads=1,
        eval_interval=0,
        seed=0,
    )
    trainer = DQNTrainer(hp, "CartPole-v1")
    trainer.replay.add(
        data["obs"],
        data["actions"],
        data["rewards"],
        data["next_obs"],
        data["dones"],
        np.full(n, GAMMA, np.float32),
    )
    return trainer


def make_sb3(batch: int, data: dict[str, np.ndarray]) -> Any:
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import Logger

    n = len(data["actions"])
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_rate=LR,
        buffer_size=n,
        learning_starts=0,
        batch_size=batch,
        gamma=GAMMA,
        train_freq=1,
        gradient_steps=1,
        target_update_interval=10**9,
        max_grad_norm=MAX_NORM,
        policy_kwargs=dict(net_arch=list(HIDDEN)),
        device="cpu",
        seed=0,
    )
    model.set_logger(Logger(folder=None, output_formats=[]))
    rb = model.replay_buffer
    assert rb is not None and rb.buffer_size == n and rb.n_envs == 1
    C.fill_sb3_replay(rb, data)
    return model


def mlp() -> torch.nn.Sequential:
    """The benchmark's Q-network as plain torch: OBS_DIM -> HIDDEN (ReLU) -> N_ACTIONS."""
    layers: list[torch.nn.Module] = []
    width = OBS_DIM
    for h in HIDDEN:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, N_ACTIONS))


class MinimalLoop:
    """The same update written directly in torch: tensors preallocated, no host sync, no metrics."""

    def __init__(self, batch: int, data: dict[str, np.ndarray]) -> None:
        torch.manual_seed(0)
        self.batch = batch
        self.t = {k: torch.from_numpy(v) for k, v in data.items()}
        self.net = mlp()
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.params = list(self.net.parameters())
        self.opt = torch.optim.Adam(self.params, lr=LR, foreach=True)
        self.gen = torch.Generator().manual_seed(0)

    def update(self) -> None:
        idx = torch.randint(0, len(self.t["actions"]), (self.batch,), generator=self.gen)
        obs, nxt = self.t["obs"][idx], self.t["next_obs"][idx]
        act, rew, done = self.t["actions"][idx], self.t["rewards"][idx], self.t["dones"][idx]
        with torch.no_grad():
            target = rew + GAMMA * (1.0 - done) * self.target(nxt).max(dim=1).values
        q = self.net(obs).gather(1, act[:, None]).squeeze(1)
        loss = F.huber_loss(q, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, MAX_NORM, foreach=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class CleanRLLoop:
    """CleanRL's ``dqn.py`` training step, as written there, on this benchmark's network and data:
    SB3's ``ReplayBuffer`` (CleanRL imports it), MSE TD loss, no clipping, Adam."""

    def __init__(self, batch: int, data: dict[str, np.ndarray]) -> None:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer

        torch.manual_seed(0)
        env = gym.make("CartPole-v1")
        n = len(data["actions"])
        self.rb = ReplayBuffer(
            n, env.observation_space, env.action_space, "cpu", handle_timeout_termination=False
        )
        C.fill_sb3_replay(self.rb, data)
        self.q_network = mlp()
        self.target_network = copy.deepcopy(self.q_network)
        self.optimizer = torch.optim.Adam(self.q_network.parameters(), lr=LR)
        self.batch = batch

    def update(self) -> None:
        data = self.rb.sample(self.batch)
        with torch.no_grad():
            target_max, _ = self.target_network(data.next_observations).max(dim=1)
            td_target = data.rewards.flatten() + GAMMA * target_max * (1 - data.dones.flatten())
        old_val = self.q_network(data.observations).gather(1, data.actions).squeeze()
        loss = F.mse_loss(td_target, old_val)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


class GemmFloor:
    """Only the update's matrix products, on preallocated outputs: the time no fp32 implementation
    of this update can go below on this BLAS (forward of the online and target nets with their
    bias adds, then the backward's input and weight gradients, each in the fastest layout found:
    the narrow first layer's weight gradient as ``X^T dY``), so ``SB3 / gemm floor`` bounds the
    speed-up over SB3 any library could show at this batch size."""

    def __init__(self, batch: int) -> None:
        g = torch.Generator().manual_seed(0)
        widths = [OBS_DIM, *HIDDEN, N_ACTIONS]
        self.w = [torch.randn(o, i, generator=g) for i, o in itertools.pairwise(widths)]
        self.b = [torch.randn(o, generator=g) for o in widths[1:]]
        self.x = torch.randn(batch, OBS_DIM, generator=g)
        self.acts = [torch.empty(batch, o) for o in widths[1:]]  # layer outputs (and their grads)
        self.grads = [torch.empty_like(w) for w in self.w]
        self.grads[0] = torch.empty(OBS_DIM, HIDDEN[0])  # stored input-major, as foxhunt does

    def update(self) -> None:
        for _ in range(2):  # online and target forward
            h = self.x
            for w, b, out in zip(self.w, self.b, self.acts, strict=True):
                h = torch.addmm(b, h, w.t(), out=out)
        n = len(self.w)
        for i in reversed(range(n)):  # dW_i = dY_i^T X_i; dX_i = dY_i W_i (not for the input)
            if i == 0:  # the narrow input layer: X^T dY, the faster layout (InputMajorLinear)
                torch.mm(self.x.t(), self.acts[0], out=self.grads[0])
                continue
            torch.mm(self.acts[i].t(), self.acts[i - 1], out=self.grads[i])
            torch.mm(self.acts[i], self.w[i], out=self.acts[i - 1])


def rate(fn: Any, n_updates: int) -> float:
    t0 = time.perf_counter()
    fn(n_updates)
    return n_updates / (time.perf_counter() - t0)


def run_batch_size(batch: int, n_fill: int, n_updates: int, reps: int) -> dict[str, Any]:
    data = random_transitions(n_fill)
    fox = make_foxhunt(batch, data, double_q=False)
    fox2 = make_foxhunt(batch, data, double_q=True)
    fox_compiled = make_foxhunt(batch, data, double_q=False, compile=True)
    fox_bf16 = make_foxhunt(batch, data, double_q=False, mixed_precision="bf16")
    fox_cleanrl = make_foxhunt(batch, data, double_q=False, cleanrl_update=True)
    sb3 = make_sb3(batch, data)
    cleanrl = CleanRLLoop(batch, data)
    minimal = MinimalLoop(batch, data)
    floor = GemmFloor(batch)
    torch.set_num_threads(1)  # after construction: nothing may have changed it back

    def fox_n(trainer: Any) -> Any:
        def run(n: int) -> None:
            for _ in range(n):
                trainer.train_step()

        return run

    def minimal_n(n: int) -> None:
        for _ in range(n):
            minimal.update()

    def floor_n(n: int) -> None:
        for _ in range(n):
            floor.update()

    def cleanrl_n(n: int) -> None:
        for _ in range(n):
            cleanrl.update()

    runners = {
        "foxhunt": fox_n(fox),
        "foxhunt_double_q": fox_n(fox2),
        "foxhunt_compiled": fox_n(fox_compiled),
        "foxhunt_bf16": fox_n(fox_bf16),
        "sb3": lambda n: sb3.train(gradient_steps=n, batch_size=batch),
        "foxhunt_cleanrl_update": fox_n(fox_cleanrl),
        "cleanrl": cleanrl_n,
        "torch_minimal": minimal_n,
        "gemm_floor": floor_n,
    }
    for run in runners.values():  # warm-up: allocator, optimizer state, lazy init, compilation
        run(max(2, n_updates // 10))
    per_rep = C.interleaved({k: (lambda r=r: rate(r, n_updates)) for k, r in runners.items()}, reps)
    med = {k: C.median(v) for k, v in per_rep.items()}
    fox_ratio = C.per_rep_ratios(per_rep["foxhunt"], per_rep["sb3"])
    return {
        "batch_size": batch,
        "updates_per_rep": n_updates,
        "reps": reps,
        "updates_per_s_median": med,
        "updates_per_s_reps": per_rep,
        "foxhunt_compiled_ran_whole_step_graph": fox_compiled.agent.graph_steps
        == fox_compiled.agent.optimizer_steps
        > 0,
        "ratio_foxhunt_vs_sb3": med["foxhunt"] / med["sb3"],
        "ratio_foxhunt_vs_sb3_paired_median": C.median(fox_ratio),
        "ratio_foxhunt_compiled_vs_sb3": med["foxhunt_compiled"] / med["sb3"],
        "ratio_foxhunt_compiled_vs_sb3_paired_median": C.median(
            C.per_rep_ratios(per_rep["foxhunt_compiled"], per_rep["sb3"])
        ),
        "ratio_foxhunt_double_q_vs_sb3": med["foxhunt_double_q"] / med["sb3"],
        "ratio_foxhunt_bf16_vs_sb3": med["foxhunt_bf16"] / med["sb3"],
        "ratio_gemm_floor_vs_sb3": med["gemm_floor"] / med["sb3"],
        "ratio_foxhunt_vs_torch_minimal": med["foxhunt"] / med["torch_minimal"],
        "ratio_foxhunt_vs_cleanrl": med["foxhunt_cleanrl_update"] / med["cleanrl"],
        "ratio_foxhunt_vs_cleanrl_paired_median": C.median(
            C.per_rep_ratios(per_rep["foxhunt_cleanrl_update"], per_rep["cleanrl"])
        ),
    }


def profile(batch: int, n_fill: int, n_updates: int) -> None:
    """Print where foxhunt's train_step spends its time (torch.profiler, CPU)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    fox = make_foxhunt(batch, random_transitions(n_fill), double_q=False)
    torch.set_num_threads(1)
    for _ in range(20):
        fox.train_step()
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n_updates):
            fox.train_step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--profile", action="store_true", help="print a torch.profiler table and exit")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.smoke:
        n_fill, sizes, reps = 1_000, {64: 4, 256: 3}, 2
    else:
        n_fill, sizes, reps = 50_000, {64: 64, 256: 32}, 25
    if args.profile:
        profile(64, n_fill, 200)
        return {}
    results = [run_batch_size(b, n_fill, n, reps) for b, n in sizes.items()]
    ratios: dict[str, float] = {}
    for r in results:
        b = r["batch_size"]
        ratios[f"foxhunt_vs_sb3_updates_per_s_b{b}"] = r["ratio_foxhunt_vs_sb3"]
        ratios[f"foxhunt_vs_sb3_updates_per_s_b{b}_paired"] = r[
            "ratio_foxhunt_vs_sb3_paired_median"
        ]
        ratios[f"foxhunt_double_q_vs_sb3_updates_per_s_b{b}"] = r["ratio_foxhunt_double_q_vs_sb3"]
        ratios[f"foxhunt_compiled_vs_sb3_updates_per_s_b{b}"] = r["ratio_foxhunt_compiled_vs_sb3"]
        ratios[f"foxhunt_compiled_vs_sb3_updates_per_s_b{b}_paired"] = r[
            "ratio_foxhunt_compiled_vs_sb3_paired_median"
        ]
        ratios[f"foxhunt_vs_torch_minimal_updates_per_s_b{b}"] = r["ratio_foxhunt_vs_torch_minimal"]
        ratios[f"foxhunt_bf16_vs_sb3_updates_per_s_b{b}"] = r["ratio_foxhunt_bf16_vs_sb3"]
        ratios[f"gemm_floor_vs_sb3_updates_per_s_b{b}"] = r["ratio_gemm_floor_vs_sb3"]
        ratios[f"foxhunt_vs_cleanrl_updates_per_s_b{b}"] = r["ratio_foxhunt_vs_cleanrl"]
        ratios[f"foxhunt_vs_cleanrl_updates_per_s_b{b}_paired"] = r[
            "ratio_foxhunt_vs_cleanrl_paired_median"
        ]
    rows = []
    for r in results:
        m = r["updates_per_s_median"]
        rows.append(
            [
                r["batch_size"],
                m["foxhunt"],
                m["foxhunt_double_q"],
                m["foxhunt_compiled"],
                m["sb3"],
                m["torch_minimal"],
                r["ratio_foxhunt_vs_sb3"],
                r["ratio_foxhunt_vs_sb3_paired_median"],
                r["ratio_foxhunt_double_q_vs_sb3"],
                r["ratio_foxhunt_compiled_vs_sb3"],
                r["ratio_foxhunt_compiled_vs_sb3_paired_median"],
                r["ratio_foxhunt_vs_torch_minimal"],
                r["ratio_foxhunt_bf16_vs_sb3"],
                r["ratio_gemm_floor_vs_sb3"],
                m["cleanrl"],
                r["ratio_foxhunt_vs_cleanrl"],
            ]
        )
    table = C.md_table(
        [
            "batch",
            "foxhunt upd/s",
            "foxhunt double-Q upd/s",
            "foxhunt compile upd/s",
            "SB3 upd/s",
            "torch minimal upd/s",
            "foxhunt / SB3",
            "foxhunt / SB3 (paired reps)",
            "foxhunt double-Q / SB3",
            "foxhunt compile / SB3",
            "(paired reps)",
            "foxhunt / torch minimal",
            "foxhunt bf16 / SB3",
            "gemm floor / SB3",
            "CleanRL upd/s",
            "foxhunt / CleanRL (its update: MSE, no clip)",
        ],
        rows,
    )
    config = {
        "network": f"MLP {OBS_DIM}-{'-'.join(map(str, HIDDEN))}-{N_ACTIONS} (ReLU)",
        "loss": "huber (delta 1)",
        "cleanrl_contender": "CleanRL dqn.py's update: SB3 ReplayBuffer, MSE, no clipping, "
        "against foxhunt with loss=mse and max_grad_norm=None",
        "max_grad_norm": MAX_NORM,
        "optimizer": "adam",
        "learning_rate": LR,
        "torch_threads": 1,
        "replay_transitions": n_fill,
        "replay_sampling_included": True,
        "target_sync": "disabled on both sides",
    }
    notes = (
        "Median updates/s over interleaved repetitions (A, B, C, D rotating). foxhunt = "
        "DQNTrainer.train_step with double_q=False (SB3's maths); foxhunt_double_q = the default "
        "double DQN; foxhunt_compiled = foxhunt with compile: true (the whole step, gradients, "
        "clipping and Adam update, as one torch.compile graph); sb3 = DQN.train(gradient_steps=N); "
        "torch_minimal = bare torch loop (floor of eager torch); foxhunt_bf16 = foxhunt with "
        "mixed_precision bf16 (autocast: not the same arithmetic as SB3's fp32, reported beside "
        "it); gemm_floor = only the update's fp32 matrix products, each in the fastest layout "
        "found (the narrow first layer's weight gradient as X^T dY)."
    )
    return C.finish("learner_throughput", args, config, results, ratios, notes, table)


if __name__ == "__main__":
    main()
