"""Clipping overhead: time per optimizer step, single-pass clip vs no clip vs a two-pass clip.

All variants run the same step (foxhunt's ``DQNAgent.compute_loss`` on an MLP 256x256 Q-network,
CartPole-shaped random batches, Adam, one torch thread) and differ only in what happens between
backward and ``optimizer.step``:

* ``no_clip``       - nothing (the floor);
* ``torch_clip``    - ``clip_grad_norm_(foreach=True)`` after the single backward (what SB3 does);
* ``foxhunt_clip``  - ``DQNAgent.backward_micro_batch`` + ``optimizer_step``: one backward, one
  norm, one in-place rescale, plus foxhunt's bookkeeping (finite check, LR schedule, stats);
* ``foxhunt_no_clip`` - the same with ``max_grad_norm=None`` (the norm is still computed: it feeds
  the health monitor and the metrics);
* ``two_pass``      - backward, global norm, then a SECOND backward of ``loss * max_norm / norm``
  into zeroed gradients (the old Rust trainer's scheme; the graph is retained, not rebuilt);
* ``foxhunt_compiled_clip`` / ``foxhunt_compiled_no_clip`` - ``DQNAgent.update`` with
  ``compile=True``: the whole step as one graph, where clipping is a multiply fused into the
  update (compiled in the warm-up).

Each foxhunt pair is one agent that switches ``max_grad_norm`` before each repetition, so the
ratio compares the same tensors in the same memory with and without the clip.

``max_grad_norm`` is set far below the gradient norm so that clipping fires on every step (the
JSON records the measured clip rate); otherwise a two-pass scheme would skip its second pass.

Run: ``python benchmarks/clipping_overhead.py [--smoke] [--out FILE.json]``
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import numpy as np  # noqa: E402
import torch  # noqa: E402

OBS_DIM, N_ACTIONS, GAMMA = 4, 2, 0.99
MAX_NORM = 1e-3  # far below any real gradient norm here: every step clips


def make_agent(max_grad_norm: float | None, compile: bool = False) -> Any:
    import gymnasium as gym

    from foxhunt.config import DQNHyperparameters
    from foxhunt.learner import DQNAgent

    hp = DQNHyperparameters(
        learning_rate=1e-4,
        gamma=GAMMA,
        batch_size=64,
        max_grad_norm=max_grad_norm,
        hidden_sizes=(256, 256),
        double_q=False,
        target_update_interval=10**9,
        device="cpu",
        compile=compile,
        seed=0,
    )
    obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    return DQNAgent(obs_space, gym.spaces.Discrete(N_ACTIONS), hp)


def make_batches(batch: int, count: int) -> list[Any]:
    from foxhunt.batch import Batch

    g = torch.Generator().manual_seed(0)
    return [
        Batch(
            obs=torch.randn(batch, OBS_DIM, generator=g),
            actions=torch.randint(0, N_ACTIONS, (batch,), generator=g),
            rewards=torch.randn(batch, generator=g),
            next_obs=torch.randn(batch, OBS_DIM, generator=g),
            dones=(torch.rand(batch, generator=g) < 0.05).float(),
        )
        for _ in range(count)
    ]


def step_fns(
    batches: list[Any],
) -> tuple[dict[str, Callable[[int], None]], dict[str, int], dict[str, bool]]:
    """One ``run(k)`` per variant: take optimizer steps on batches ``k, k+1, ...`` (cycled)."""
    agents = {
        "no_clip": make_agent(None),
        "torch_clip": make_agent(None),
        "foxhunt": make_agent(MAX_NORM),
        "two_pass": make_agent(None),
        "foxhunt_compiled": make_agent(MAX_NORM, compile=True),
    }
    # foxhunt's clip and no-clip variants share one agent (one eager, one compiled) and switch
    # max_grad_norm before each repetition: two agents of one process differ by a few percent on
    # their own (an A/A control measured 1-3%), the size of the effect measured here.
    variant_hp: dict[str, Any] = {}
    all_graph: dict[str, bool] = {}
    whole_steps: dict[str, Any] = {}
    for kind in ("foxhunt", "foxhunt_compiled"):
        a = agents[kind]
        variant_hp[f"{kind}_clip"] = a.hp
        variant_hp[f"{kind}_no_clip"] = a.hp.model_copy(update={"max_grad_norm": None})
    comp = agents["foxhunt_compiled"]
    # max_grad_norm is a constant of the traced graph: each variant has its graph (and the
    # record of its constants, which the agent checks before every step).
    whole_steps["foxhunt_compiled_clip"] = (comp._whole_step, comp._baked)
    comp.hp = variant_hp["foxhunt_compiled_no_clip"]
    whole_steps["foxhunt_compiled_no_clip"] = (comp._build_whole_step(), comp._baked)
    comp.hp = variant_hp["foxhunt_compiled_clip"]
    clip_stats = {
        "foxhunt_clip_steps": 0,
        "foxhunt_clipped": 0,
        "foxhunt_compiled_clip_steps": 0,
        "foxhunt_compiled_clipped": 0,
    }
    nb = len(batches)

    def loss_of(agent: Any, b: Any) -> torch.Tensor:
        return agent.compute_loss(b)[0].mean()

    def no_clip(n: int) -> None:
        a = agents["no_clip"]
        for i in range(n):
            loss_of(a, batches[i % nb]).backward()
            a.optimizer.step()
            a.optimizer.zero_grad(set_to_none=True)

    def torch_clip(n: int) -> None:
        a = agents["torch_clip"]
        for i in range(n):
            loss_of(a, batches[i % nb]).backward()
            torch.nn.utils.clip_grad_norm_(a.params, MAX_NORM, foreach=True)
            a.optimizer.step()
            a.optimizer.zero_grad(set_to_none=True)

    def foxhunt(name: str) -> Callable[[int], None]:
        a = agents["foxhunt"]

        def run(n: int) -> None:
            a.hp = variant_hp[name]
            for i in range(n):
                a.backward_micro_batch(batches[i % nb], 1.0)
                stats = a.optimizer_step()
                if name == "foxhunt_clip":
                    clip_stats["foxhunt_clip_steps"] += 1
                    clip_stats["foxhunt_clipped"] += int(stats.clipped)

        return run

    def foxhunt_compiled(name: str) -> Callable[[int], None]:
        a = agents["foxhunt_compiled"]

        def run(n: int) -> None:
            a.hp, (a._whole_step, a._baked) = variant_hp[name], whole_steps[name]
            graph_steps = a.graph_steps
            for i in range(n):
                stats = a.update(batches[i % nb])[1]
                if name == "foxhunt_compiled_clip":
                    clip_stats["foxhunt_compiled_clip_steps"] += 1
                    clip_stats["foxhunt_compiled_clipped"] += int(stats.clipped)
            # Every step of every repetition ran as the one-graph step.
            all_graph[name] = all_graph.get(name, True) and a.graph_steps - graph_steps == n

        return run

    def two_pass(n: int) -> None:
        a = agents["two_pass"]
        for i in range(n):
            loss = loss_of(a, batches[i % nb])
            loss.backward(retain_graph=True)
            norm = float(torch.nn.utils.get_total_norm([p.grad for p in a.params], foreach=True))
            if norm > MAX_NORM:
                a.optimizer.zero_grad(set_to_none=True)
                (loss * (MAX_NORM / norm)).backward()
            a.optimizer.step()
            a.optimizer.zero_grad(set_to_none=True)

    fns = {
        "no_clip": no_clip,
        "torch_clip": torch_clip,
        "foxhunt_clip": foxhunt("foxhunt_clip"),
        "foxhunt_no_clip": foxhunt("foxhunt_no_clip"),
        "two_pass": two_pass,
        "foxhunt_compiled_clip": foxhunt_compiled("foxhunt_compiled_clip"),
        "foxhunt_compiled_no_clip": foxhunt_compiled("foxhunt_compiled_no_clip"),
    }
    return fns, clip_stats, all_graph


def ms_per_step(fn: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t0) / n * 1e3


def run_batch_size(batch: int, n_steps: int, reps: int) -> dict[str, Any]:
    fns, clip_stats, all_graph = step_fns(make_batches(batch, 16))
    torch.set_num_threads(1)
    for fn in fns.values():
        fn(max(2, n_steps // 10))
    per_rep = C.interleaved(
        {k: (lambda f=f: ms_per_step(f, n_steps)) for k, f in fns.items()}, reps
    )
    med = {k: C.median(v) for k, v in per_rep.items()}
    base = med["no_clip"]
    clip_rate = clip_stats["foxhunt_clipped"] / max(1, clip_stats["foxhunt_clip_steps"])
    compiled_rate = clip_stats["foxhunt_compiled_clipped"] / max(
        1, clip_stats["foxhunt_compiled_clip_steps"]
    )
    return {
        "batch_size": batch,
        "steps_per_rep": n_steps,
        "reps": reps,
        "ms_per_step_median": med,
        "ms_per_step_reps": per_rep,
        "ratio_vs_no_clip": {k: v / base for k, v in med.items()},
        "ratio_vs_no_clip_paired_median": {
            k: C.median(C.per_rep_ratios(v, per_rep["no_clip"])) for k, v in per_rep.items()
        },
        "ratio_two_pass_vs_foxhunt_clip": med["two_pass"] / med["foxhunt_clip"],
        "ratio_foxhunt_clip_vs_foxhunt_no_clip": med["foxhunt_clip"] / med["foxhunt_no_clip"],
        "ratio_foxhunt_clip_vs_foxhunt_no_clip_paired_median": C.median(
            C.per_rep_ratios(per_rep["foxhunt_clip"], per_rep["foxhunt_no_clip"])
        ),
        "ratio_foxhunt_compiled_clip_vs_foxhunt_compiled_no_clip": med["foxhunt_compiled_clip"]
        / med["foxhunt_compiled_no_clip"],
        "ratio_foxhunt_compiled_clip_vs_foxhunt_compiled_no_clip_paired_median": C.median(
            C.per_rep_ratios(per_rep["foxhunt_compiled_clip"], per_rep["foxhunt_compiled_no_clip"])
        ),
        "foxhunt_clip_rate": clip_rate,
        "foxhunt_compiled_clip_rate": compiled_rate,
        "foxhunt_compiled_ran_whole_step_graph": len(all_graph) == 2 and all(all_graph.values()),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parser(__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)
    sizes, reps = ({64: 4, 256: 3}, 2) if args.smoke else ({64: 50, 256: 25}, 41)
    results = [run_batch_size(b, n, reps) for b, n in sizes.items()]
    ratios: dict[str, float] = {}
    rows = []
    for r in results:
        b, rv, m = r["batch_size"], r["ratio_vs_no_clip"], r["ms_per_step_median"]
        ratios[f"foxhunt_clip_vs_no_clip_b{b}"] = rv["foxhunt_clip"]
        paired = r["ratio_vs_no_clip_paired_median"]
        ratios[f"foxhunt_clip_vs_no_clip_b{b}_paired"] = paired["foxhunt_clip"]
        ratios[f"two_pass_vs_no_clip_b{b}_paired"] = paired["two_pass"]
        ratios[f"torch_clip_vs_no_clip_b{b}"] = rv["torch_clip"]
        ratios[f"two_pass_vs_no_clip_b{b}"] = rv["two_pass"]
        ratios[f"two_pass_vs_foxhunt_clip_b{b}"] = r["ratio_two_pass_vs_foxhunt_clip"]
        ratios[f"foxhunt_clip_vs_foxhunt_no_clip_b{b}"] = r["ratio_foxhunt_clip_vs_foxhunt_no_clip"]
        own_paired = r["ratio_foxhunt_clip_vs_foxhunt_no_clip_paired_median"]
        ratios[f"foxhunt_clip_vs_foxhunt_no_clip_b{b}_paired"] = own_paired
        compiled = r["ratio_foxhunt_compiled_clip_vs_foxhunt_compiled_no_clip"]
        compiled_paired = r["ratio_foxhunt_compiled_clip_vs_foxhunt_compiled_no_clip_paired_median"]
        ratios[f"foxhunt_compiled_clip_vs_foxhunt_compiled_no_clip_b{b}"] = compiled
        ratios[f"foxhunt_compiled_clip_vs_foxhunt_compiled_no_clip_b{b}_paired"] = compiled_paired
        rows.append(
            [
                b,
                m["no_clip"],
                m["torch_clip"],
                m["foxhunt_no_clip"],
                m["foxhunt_clip"],
                m["two_pass"],
                rv["torch_clip"],
                rv["foxhunt_clip"],
                paired["foxhunt_clip"],
                rv["two_pass"],
                r["ratio_foxhunt_clip_vs_foxhunt_no_clip"],
                own_paired,
                m["foxhunt_compiled_no_clip"],
                m["foxhunt_compiled_clip"],
                compiled,
                compiled_paired,
            ]
        )
    table = C.md_table(
        [
            "batch",
            "no clip ms",
            "torch clip ms",
            "foxhunt no-clip ms",
            "foxhunt clip ms",
            "two-pass ms",
            "torch clip / no clip",
            "foxhunt clip / no clip",
            "(paired reps)",
            "two-pass / no clip",
            "foxhunt clip / foxhunt no-clip",
            "(paired reps)",
            "compiled no-clip ms",
            "compiled clip ms",
            "compiled clip / compiled no-clip",
            "(paired reps)",
        ],
        rows,
    )
    config = {
        "network": "MLP 4-256-256-2 (ReLU), foxhunt DQNAgent.compute_loss (double_q=False)",
        "optimizer": "adam (fused kernel)",
        "max_grad_norm": MAX_NORM,
        "torch_threads": 1,
        "batches": "16 fixed random batches, cycled (no replay sampling in the timing)",
    }
    notes = (
        "Median ms per optimizer step over interleaved repetitions; clipping forced to fire "
        "on every step. two_pass retains the graph for its second backward."
    )
    return C.finish("clipping_overhead", args, config, results, ratios, notes, table)


if __name__ == "__main__":
    main()
