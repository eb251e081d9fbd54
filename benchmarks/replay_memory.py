"""Replay memory for pixel observations: foxhunt's buffer against Stable-Baselines3's, side by side.

Image agents are bounded by replay memory: 84x84x4 frames are 28 KiB each as uint8, 110 KiB as
float32, and a transition holds two of them. foxhunt scales 0-255 pixels to [0, 1] for the network
(``PixelObservation``) and stores them in replay as their uint8 levels, handing batches back as the
identical float32 values. SB3's ``ReplayBuffer`` stores the env's uint8 too (its policy divides by
255 at the forward pass), by default both ``obs`` and ``next_obs``, as foxhunt does
(``optimize_memory_usage=True``, off by default, keeps one copy).

Measured in one process on the same random frames:

* bytes per transition: each buffer's storage arrays over its capacity (what it allocates up front);
* storing: wall time to add one vector step of 8 envs' frames (foxhunt takes the wrapper's float32
  and checks each value is exactly a level before keeping the level);
* sampling: wall time to draw a batch and have it as torch tensors ready for the network, the two
  buffers taking turns (foxhunt's includes turning levels into float32, SB3's returns uint8 and its
  policy converts later, so this is the fair share of the work each buffer does).

Run: ``python benchmarks/replay_memory.py [--smoke] [--out FILE.json]``
"""

from __future__ import annotations

from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

SHAPE = (4, 84, 84)


class _Frames(gym.Env):
    """Only its spaces matter: the benchmark fills replay directly."""

    observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(6)


def _foxhunt_replay(capacity: int) -> Any:
    """The replay a DQNTrainer builds for a pixel env (so the trainer's own choice is measured)."""
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters(
        buffer_capacity=capacity, hidden_sizes=(8,), eval_interval=0, torch_threads=1, seed=0
    )
    trainer = DQNTrainer(hp, _Frames)
    replay = trainer.replay
    trainer.close()
    return replay


def _sb3_replay(capacity: int) -> Any:
    from stable_baselines3.common.buffers import ReplayBuffer

    space = _Frames.observation_space
    return ReplayBuffer(capacity, space, _Frames.action_space, device="cpu", n_envs=1)


def _bytes(arrays: list[Any]) -> int:
    return int(
        sum(a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.element_size() for a in arrays)
    )


def measure_add(reps: int, n_envs: int = 8) -> dict[str, list[float]]:
    """Seconds to store one vector step of ``n_envs`` frames: foxhunt (the wrapper's float32
    in, uint8 levels stored after an exact check), foxhunt's buffer keeping float32 (as before),
    and SB3 (the env's uint8 in)."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

    from foxhunt.replay import ReplayBuffer

    capacity = 64 * n_envs
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (n_envs, *SHAPE), dtype=np.uint8)
    scaled = frames.astype(np.float32) * np.float32(1 / 255)
    fox = _foxhunt_replay(capacity)
    flt = ReplayBuffer(capacity, SHAPE, seed=0)
    space = _Frames.observation_space
    sb3 = SB3Buffer(capacity, space, _Frames.action_space, device="cpu", n_envs=n_envs)
    acts, zeros, ones = np.zeros(n_envs, np.int64), np.zeros(n_envs), np.ones(n_envs)
    infos = [{} for _ in range(n_envs)]
    return C.interleaved(
        {
            "foxhunt": lambda: C.timed(lambda: fox.add(scaled, acts, zeros, scaled, zeros, ones)),
            "foxhunt_float32_storage": lambda: C.timed(
                lambda: flt.add(scaled, acts, zeros, scaled, zeros, ones)
            ),
            "sb3": lambda: C.timed(lambda: sb3.add(frames, frames, acts, zeros, zeros, infos)),
        },
        reps,
    )


def measure(capacity: int, batch: int, reps: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    fox = _foxhunt_replay(capacity)
    sb3 = _sb3_replay(capacity)
    chunk = 256
    for start in range(0, capacity, chunk):
        k = min(chunk, capacity - start)
        frames = rng.integers(0, 256, (k + 1, *SHAPE), dtype=np.uint8)
        actions = rng.integers(0, 6, k)
        scaled = frames.astype(np.float32) * np.float32(1 / 255)  # what the wrapper hands over
        fox.add(scaled[:-1], actions, np.zeros(k), scaled[1:], np.zeros(k), np.full(k, 0.99))
        for i in range(k):
            sb3.add(
                frames[i][None],
                frames[i + 1][None],
                actions[i : i + 1],
                np.zeros(1),
                np.zeros(1),
                [{}],
            )
    fox_bytes = fox.nbytes
    sb3_arrays = [
        sb3.observations,
        sb3.next_observations,
        sb3.actions,
        sb3.rewards,
        sb3.dones,
        sb3.timeouts,
    ]
    sb3_bytes = _bytes(sb3_arrays)
    float_obs = 2 * capacity * int(np.prod(SHAPE)) * 4  # the same rows kept as float32

    def fox_sample() -> float:
        return C.timed(lambda: fox.sample(batch))

    def sb3_sample() -> float:
        return C.timed(lambda: sb3.sample(batch))

    def sb3_sample_preprocessed() -> float:
        def run() -> None:
            data = sb3.sample(batch)
            data.observations.float() / 255.0, data.next_observations.float() / 255.0

        return C.timed(run)

    contenders = {"foxhunt": fox_sample, "sb3": sb3_sample, "sb3_float": sb3_sample_preprocessed}
    times = C.interleaved(contenders, reps)
    ms = {k: 1e3 * C.median(v) for k, v in times.items()}
    adds = measure_add(reps)
    return {
        "capacity": capacity,
        "batch_size": batch,
        "obs_shape": list(SHAPE),
        "bytes_per_transition": {
            "foxhunt": fox_bytes / capacity,
            "sb3": sb3_bytes / capacity,
            "float32_obs_storage": (float_obs + capacity * 20) / capacity,
        },
        "foxhunt_obs_dtype": str(fox.obs.dtype),
        "sample_ms_median": ms,
        "add_ms_median": {k: 1e3 * C.median(v) for k, v in adds.items()},
        "add_ratio_vs_sb3_paired_median": C.median(C.per_rep_ratios(adds["foxhunt"], adds["sb3"])),
        "add_ratio_vs_float32_storage_paired_median": C.median(
            C.per_rep_ratios(adds["foxhunt"], adds["foxhunt_float32_storage"])
        ),
        "sample_ratio_paired_median": C.median(C.per_rep_ratios(times["foxhunt"], times["sb3"])),
        "sample_ratio_vs_sb3_float_paired_median": C.median(
            C.per_rep_ratios(times["foxhunt"], times["sb3_float"])
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parser(__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)
    capacity, batch, reps = (512, 32, 5) if args.smoke else (20_000, 32, 201)
    r = measure(capacity, batch, reps)
    b = r["bytes_per_transition"]
    ratios = {
        "foxhunt_vs_sb3_bytes_per_transition": b["foxhunt"] / b["sb3"],
        "foxhunt_vs_float32_storage_bytes": b["foxhunt"] / b["float32_obs_storage"],
        "foxhunt_vs_sb3_sample_time": r["sample_ms_median"]["foxhunt"]
        / r["sample_ms_median"]["sb3"],
        "foxhunt_vs_sb3_sample_time_paired": r["sample_ratio_paired_median"],
        "foxhunt_vs_sb3_sample_and_float_time_paired": r["sample_ratio_vs_sb3_float_paired_median"],
        "foxhunt_vs_sb3_add_time_paired": r["add_ratio_vs_sb3_paired_median"],
        "foxhunt_vs_float32_storage_add_time_paired": r[
            "add_ratio_vs_float32_storage_paired_median"
        ],
    }
    add, smp = r["add_ms_median"], r["sample_ms_median"]
    table = C.md_table(
        ["buffer", "bytes / transition", "add 8 envs ms", f"sample {batch} ms (median)"],
        [
            ["foxhunt (uint8 levels)", b["foxhunt"], add["foxhunt"], smp["foxhunt"]],
            ["SB3 ReplayBuffer (uint8)", b["sb3"], add["sb3"], smp["sb3"]],
            ["SB3 + its policy's float()/255", b["sb3"], "-", smp["sb3_float"]],
            [
                "float32 storage (before)",
                b["float32_obs_storage"],
                add["foxhunt_float32_storage"],
                "-",
            ],
        ],
    )
    notes = (
        f"{capacity} transitions of {SHAPE} uint8 frames; batch {batch}; {reps} interleaved "
        "repetitions of one sample each. foxhunt's time includes turning levels into float32."
    )
    config = {"capacity": capacity, "batch_size": batch, "reps": reps, "obs_shape": list(SHAPE)}
    return C.finish("replay_memory", args, config, [r], ratios, notes, table)


if __name__ == "__main__":
    main()
