"""Sum tree, uniform and prioritized replay: exact sums, sampling law, weights, state round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from foxhunt.replay import PrioritizedReplayBuffer, ReplayBuffer, SumTree


def _fill(buf: ReplayBuffer, n: int, seed: int = 0, chunk: int = 7) -> None:
    """Add ``n`` transitions in chunks; obs[i] = i so slots can be identified."""
    rng = np.random.default_rng(seed)
    start = 0
    while start < n:
        k = min(chunk, n - start)
        ids = np.arange(start, start + k)
        obs = np.repeat(ids[:, None], buf.obs_shape[0], axis=1).astype(np.float32)
        buf.add(
            obs,
            rng.integers(0, 3, k),
            rng.normal(size=k),
            obs + 0.5,
            (rng.random(k) < 0.1).astype(np.float32),
            np.full(k, 0.9),
        )
        start += k


def _check_tree_consistent(tree: SumTree) -> None:
    for node in range(1, tree.leaf_base):
        assert tree.tree[node] == pytest.approx(tree.tree[2 * node] + tree.tree[2 * node + 1])


# --- sum tree -----------------------------------------------------------------------------------
def test_sum_tree_total_and_prefix_search_non_power_of_two() -> None:
    tree = SumTree(5)
    assert tree.leaf_base == 8
    tree.update(np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert tree.total == 15.0
    # prefix sums: [0, 1), [1, 3), [3, 6), [6, 10), [10, 15)
    values = np.array([0.0, 0.99, 1.0, 2.99, 3.0, 5.99, 6.0, 9.99, 10.0, 14.99])
    np.testing.assert_array_equal(tree.find_prefix(values), [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    np.testing.assert_array_equal(tree.get(np.array([4, 0])), [5.0, 1.0])
    _check_tree_consistent(tree)


def test_sum_tree_update_with_duplicates_last_wins() -> None:
    tree = SumTree(6)
    tree.update(np.arange(6), np.ones(6))
    tree.update(np.array([1, 3, 1]), np.array([7.0, 2.0, 9.0]))
    np.testing.assert_array_equal(tree.get(np.arange(6)), [1, 9, 1, 2, 1, 1])
    assert tree.total == 15.0
    _check_tree_consistent(tree)


@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 8, 13, 100])
def test_sum_tree_matches_reference_cumsum(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    for _ in range(20):
        idx = rng.integers(0, capacity, size=rng.integers(1, 10))
        pri = rng.random(idx.size) * 5
        tree.update(idx, pri)
        for i, p in zip(idx, pri, strict=True):  # sequential: last duplicate wins
            ref[i] = p
        assert tree.total == pytest.approx(ref.sum())
        _check_tree_consistent(tree)
    cum = np.cumsum(ref)
    values = rng.random(200) * ref.sum() * (1 - 1e-12)
    expected = np.searchsorted(cum, values, side="right")
    np.testing.assert_array_equal(tree.find_prefix(values), expected)


def test_sum_tree_rejects_bad_input() -> None:
    tree = SumTree(4)
    with pytest.raises(IndexError):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(RuntimeError, match="all priorities are zero"):
        tree.sample_stratified(4, np.random.default_rng(0), 4)


def test_stratified_sampling_one_per_stratum() -> None:
    tree = SumTree(4)
    tree.update(np.arange(4), np.array([1.0, 1.0, 1.0, 1.0]))
    # With equal priorities and n = capacity, stratum k covers exactly leaf k.
    leaves = tree.sample_stratified(4, np.random.default_rng(0), 4)
    np.testing.assert_array_equal(leaves, [0, 1, 2, 3])


# --- prioritized replay -------------------------------------------------------------------------
def test_per_sampling_frequencies_match_priorities() -> None:
    """Chi-square over ~51k draws: P(i) = p_i^alpha / sum p^alpha (alpha really applied)."""
    alpha = 0.7
    buf = PrioritizedReplayBuffer(16, (2,), alpha=alpha, eps=0.0, seed=3)
    _fill(buf, 7)
    td = np.array([1.0, 2.0, 3.0, 4.0, 0.5, 6.0, 10.0])
    buf.update_priorities(np.arange(7), td)
    expected = td**alpha / np.sum(td**alpha)
    counts = np.zeros(7)
    for _ in range(200):
        idx = buf.sample(256, beta=0.5).indices.numpy()
        counts += np.bincount(idx, minlength=7)
    assert counts.sum() == 200 * 256
    result = stats.chisquare(counts, expected * counts.sum())
    assert result.pvalue > 1e-3, (counts / counts.sum(), expected)
    # Without the exponent the law would be clearly different: the test can tell them apart.
    wrong = td / td.sum()
    assert stats.chisquare(counts, wrong * counts.sum()).pvalue < 1e-10


def test_per_weights_formula_and_indices() -> None:
    alpha, beta = 0.6, 0.4
    buf = PrioritizedReplayBuffer(64, (3,), alpha=alpha, eps=1e-6, seed=1)
    _fill(buf, 40)
    td = np.random.default_rng(5).exponential(size=40)
    buf.update_priorities(np.arange(40), td)
    batch = buf.sample(32, beta=beta)
    idx = batch.indices.numpy()
    assert batch.weights is not None and batch.weights.dtype == torch.float32
    p = (np.abs(td) + 1e-6) ** alpha
    probs = p / p.sum()
    w = (40 * probs[idx]) ** (-beta)
    np.testing.assert_allclose(batch.weights.numpy(), w / w.max(), rtol=1e-5)
    assert batch.weights.max().item() == pytest.approx(1.0)
    # Rows really are the indexed slots (obs[i] == i by construction).
    np.testing.assert_array_equal(batch.obs[:, 0].numpy(), idx.astype(np.float32))
    # normalize=False hands back the raw (N P)^-beta for a caller normalising over more samples.
    state = buf.rng.bit_generator.state
    raw = buf.sample(32, beta=beta, normalize=False)
    buf.rng.bit_generator.state = state
    normed = buf.sample(32, beta=beta)
    assert torch.equal(raw.indices, normed.indices)
    np.testing.assert_allclose(
        raw.weights.numpy(), (40 * probs[raw.indices.numpy()]) ** -beta, rtol=1e-5
    )
    torch.testing.assert_close(normed.weights, raw.weights / raw.weights.max())


def test_per_new_transitions_get_max_priority_and_updates() -> None:
    alpha = 0.5
    buf = PrioritizedReplayBuffer(8, (1,), alpha=alpha, eps=0.01, seed=0)
    _fill(buf, 3)
    np.testing.assert_allclose(buf.tree.get(np.arange(3)), 1.0)  # initial max priority 1
    buf.update_priorities(np.array([0, 1, 2]), np.array([-3.0, 0.0, 0.5]))
    np.testing.assert_allclose(
        buf.tree.get(np.arange(3)), np.array([3.01, 0.01, 0.51]) ** alpha, rtol=1e-12
    )
    assert buf.max_priority == pytest.approx(3.01)
    _fill(buf, 2)
    np.testing.assert_allclose(buf.tree.get(np.array([3, 4])), 3.01**alpha, rtol=1e-12)
    assert buf.tree.total == pytest.approx(
        2 * 3.01**alpha + 0.01**alpha + 0.51**alpha + 3.01**alpha
    )
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities(np.array([0]), np.array([np.nan]))


def test_per_overwritten_slot_gets_max_priority() -> None:
    buf = PrioritizedReplayBuffer(4, (1,), alpha=1.0, eps=0.0, seed=0)
    _fill(buf, 4)
    buf.update_priorities(np.arange(4), np.array([0.1, 5.0, 0.2, 0.3]))
    _fill(buf, 1)  # wraps onto slot 0
    assert buf.tree.get(np.array([0]))[0] == pytest.approx(5.0)
    assert buf.tree.total == pytest.approx(5.0 + 5.0 + 0.2 + 0.3)


# --- uniform replay -----------------------------------------------------------------------------
def test_uniform_wraparound() -> None:
    buf = ReplayBuffer(5, (2,), seed=0)
    _fill(buf, 4, chunk=4)
    assert (len(buf), buf.pos) == (4, 4)
    _fill(buf, 3, chunk=3)  # ids 0, 1, 2 again -> slots 4, 0, 1
    assert (len(buf), buf.pos) == (5, 2)
    np.testing.assert_array_equal(buf.obs[:, 0].numpy(), [1, 2, 2, 3, 0])
    np.testing.assert_array_equal(buf.next_obs[:, 0].numpy(), [1.5, 2.5, 2.5, 3.5, 0.5])


def test_uniform_sample_shapes_dtypes_and_range() -> None:
    buf = ReplayBuffer(100, (4,), seed=0)
    _fill(buf, 30)
    b = buf.sample(64)
    assert b.obs.shape == (64, 4) and b.next_obs.shape == (64, 4)
    assert b.obs.dtype == torch.float32
    assert b.actions.dtype == torch.int64 and b.actions.shape == (64,)
    for t in (b.rewards, b.dones, b.discounts):
        assert t.dtype == torch.float32 and t.shape == (64,)
    assert b.weights is None and b.indices is not None and b.indices.dtype == torch.int64
    idx = b.indices.numpy()
    assert idx.min() >= 0 and idx.max() < 30
    np.testing.assert_array_equal(b.obs[:, 0].numpy(), idx)
    np.testing.assert_allclose(b.discounts.numpy(), 0.9)
    # Sampling covers the whole filled range roughly uniformly.
    counts = np.bincount(np.concatenate([buf.sample(300).indices.numpy() for _ in range(20)]))
    assert counts.size == 30 and stats.chisquare(counts).pvalue > 1e-3
    with pytest.raises(RuntimeError, match="empty"):
        ReplayBuffer(4, (1,)).sample(2)


def test_sample_batches_do_not_alias_storage() -> None:
    buf = ReplayBuffer(10, (2,), seed=0)
    _fill(buf, 10)
    b = buf.sample(4)
    before = buf.obs.clone()
    b.obs.add_(100.0)
    assert torch.equal(buf.obs, before)


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("n_added", [13, 40])  # partly filled and wrapped
def test_state_round_trip_reproduces_future_samples(prioritized: bool, n_added: int) -> None:
    def make(seed: int) -> ReplayBuffer:
        if prioritized:
            return PrioritizedReplayBuffer(32, (3,), alpha=0.6, eps=1e-3, seed=seed)
        return ReplayBuffer(32, (3,), seed=seed)

    a = make(0)
    _fill(a, n_added)
    if prioritized:
        a.update_priorities(np.arange(len(a)), np.random.default_rng(2).exponential(size=len(a)))
    a.sample(8, beta=0.5)  # advance the RNG so the state is not the initial one
    tensors = {k: v.clone() for k, v in a.state_tensors().items()}
    state = json.loads(json.dumps(a.state_json()))  # must survive JSON
    b = make(99)
    b.load_state(tensors, state)
    assert (b.pos, b.size) == (a.pos, a.size)
    for step in range(3):
        sa, sb = a.sample(16, beta=0.7), b.sample(16, beta=0.7)
        for name in ("obs", "actions", "rewards", "next_obs", "dones", "discounts", "indices"):
            assert torch.equal(getattr(sa, name), getattr(sb, name)), name
        if prioritized:
            assert torch.equal(sa.weights, sb.weights)
            td = np.full(16, 0.1 * (step + 1))
            a.update_priorities(sa.indices.numpy(), td)
            b.update_priorities(sb.indices.numpy(), td)
        _fill(a, 3, seed=step)
        _fill(b, 3, seed=step)


def test_load_state_rejects_wrong_shapes() -> None:
    a = ReplayBuffer(8, (3,), seed=0)
    _fill(a, 5)
    b = ReplayBuffer(8, (4,), seed=0)
    with pytest.raises(ValueError, match=r"replay\.obs"):
        b.load_state(a.state_tensors(), a.state_json())


def test_buffers_refuse_settings_they_cannot_honour() -> None:
    from foxhunt.errors import ConfigError

    for make, needle in (
        (lambda: ReplayBuffer(0, (4,)), "capacity must be a positive integer, got: 0"),
        (lambda: PrioritizedReplayBuffer(8, (4,), alpha=-1.0), "alpha must be a finite number"),
        (lambda: PrioritizedReplayBuffer(8, (4,), alpha=math.nan), "alpha must be a finite"),
        (lambda: PrioritizedReplayBuffer(8, (4,), eps=-1e-6), "eps must be a finite number"),
        (lambda: ReplayBuffer(8, (4,)).sample(0), "batch_size must be a positive integer"),
        (lambda: ReplayBuffer(8, (4,)).sample(True), "batch_size must be an integer"),
        (lambda: PrioritizedReplayBuffer(8, (4,)).sample(-1), "batch_size must be a positive"),
    ):
        with pytest.raises(ConfigError, match=needle):
            make()


@pytest.mark.parametrize("prioritized", [False, True])
def test_pixel_observations_are_stored_as_uint8_levels_and_gathered_bit_for_bit(
    prioritized: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Scaled pixels (PixelObservation's level * float32(1/255)) cost a quarter of the memory
    and come back as exactly the float32 values the env gave; a checkpoint of the float32 era
    loads into the uint8 storage unchanged; a value that is no level turns storage back into
    float32 without losing anything."""
    from foxhunt.envs.gym_envs import PIXEL_SCALE

    rng = np.random.default_rng(0)
    levels = rng.integers(0, 256, (20, 2, 3), dtype=np.uint8)
    levels[0] = 0
    levels[1] = 255
    scaled = levels.astype(np.float32) * np.float32(PIXEL_SCALE)  # the wrapper's arithmetic
    kind = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    pix = kind(32, (2, 3), obs_scale=PIXEL_SCALE, seed=0)
    flt = kind(32, (2, 3), seed=0)
    for buf in (pix, flt):
        for lo in range(0, 20, 6):  # chunks, as vector envs add them
            sl = slice(lo, lo + 6)
            k = len(levels[sl])
            buf.add(scaled[sl], np.zeros(k), np.ones(k), scaled[sl][::-1], np.zeros(k), np.ones(k))
    assert pix.obs.dtype == torch.uint8
    np.testing.assert_array_equal(pix.obs[:20].numpy(), levels)
    obs_bytes = 2 * 32 * 6  # obs and next_obs, 32 rows of 6 entries
    assert flt.nbytes - pix.nbytes == 3 * obs_bytes  # 4 bytes an entry down to 1
    a, b = pix.sample(64), flt.sample(64)
    assert a.obs.dtype == torch.float32
    assert torch.equal(a.indices, b.indices)
    assert torch.equal(a.obs, b.obs) and torch.equal(a.next_obs, b.next_obs)  # bit for bit
    # A checkpoint written while replay stored floats (flt's tensors) resumes the same.
    old = flt.state_tensors()
    assert old["replay.obs"].dtype == torch.float32
    restored = kind(32, (2, 3), obs_scale=PIXEL_SCALE, seed=5)
    restored.load_state(old, flt.state_json())
    assert torch.equal(restored.obs, pix.obs) and torch.equal(restored.next_obs, pix.next_obs)
    mine = kind(32, (2, 3), obs_scale=PIXEL_SCALE, seed=5)
    mine.load_state(pix.state_tensors(), pix.state_json())
    assert torch.equal(mine.sample(16).obs, restored.sample(16).obs)
    # A value that is no level (a wrapper changed the pixels after scaling): replay keeps
    # floats from then on, with every value it holds unchanged.
    bad = scaled[:2].copy()
    bad[1, 0, 1] = 0.5
    with caplog.at_level("WARNING", logger="foxhunt.replay.uniform"):
        pix.add(scaled[:2], np.zeros(2), np.ones(2), bad, np.zeros(2), np.ones(2))
    assert "float32 from now on" in caplog.text and "value 0.5 is not" in caplog.text
    assert pix.obs.dtype == torch.float32 and pix.obs_scale is None
    flt.add(scaled[:2], np.zeros(2), np.ones(2), bad, np.zeros(2), np.ones(2))
    assert torch.equal(pix.obs, flt.obs) and torch.equal(pix.next_obs, flt.next_obs)
    assert torch.equal(pix.next_obs[21, 0, 1], torch.tensor(0.5))
    # Its checkpoint resumes into a fresh (uint8) buffer as floats again.
    again = kind(32, (2, 3), obs_scale=PIXEL_SCALE, seed=5)
    with caplog.at_level("WARNING", logger="foxhunt.replay.uniform"):
        again.load_state(pix.state_tensors(), pix.state_json())
    assert again.obs.dtype == torch.float32
    assert torch.equal(again.next_obs, pix.next_obs)


def test_pixel_storage_keeps_every_value_that_is_not_exactly_a_level() -> None:
    """Only values that are bit for bit a level times float32(1/255) become levels. Near
    misses (L/255 rounded from float64, one ulp above a level, -0.0), which a wrapper after
    the scaling can produce, turn storage back into float32 and come back unchanged."""
    from foxhunt.envs.gym_envs import PIXEL_SCALE

    levels = np.arange(256, dtype=np.uint8).reshape(64, 4)
    exact = levels.astype(np.float32) * np.float32(PIXEL_SCALE)
    divided = (levels / 255.0).astype(np.float32)
    assert not np.array_equal(divided, exact)  # the two roundings differ for some levels
    ulp = np.nextafter(exact, np.float32(2))
    negzero = np.full((64, 4), -0.0, np.float32)
    for near in (divided, ulp, negzero):
        buf = ReplayBuffer(128, (4,), obs_scale=PIXEL_SCALE, seed=0)
        buf.add(exact, np.zeros(64), np.zeros(64), exact, np.zeros(64), np.ones(64))
        assert buf.obs.dtype == torch.uint8
        buf.add(near, np.zeros(64), np.zeros(64), exact, np.zeros(64), np.ones(64))
        assert buf.obs.dtype == torch.float32
        got = buf.gather(np.arange(128)).obs.numpy()
        np.testing.assert_array_equal(got.view(np.uint32)[:64], exact.view(np.uint32))
        np.testing.assert_array_equal(got.view(np.uint32)[64:], near.view(np.uint32))


def test_pixel_storage_mode_follows_the_checkpoint_and_back() -> None:
    """load_state takes the storage mode the checkpoint holds: float32 from a run that had
    switched, uint8 levels again from one that had not (a failed restore rolls back by
    loading the earlier state, which must bring the levels back, not write them unscaled)."""
    from foxhunt.envs.gym_envs import PIXEL_SCALE

    rng = np.random.default_rng(1)
    exact = rng.integers(0, 256, (20, 4)).astype(np.float32) * np.float32(PIXEL_SCALE)
    buf = ReplayBuffer(32, (4,), obs_scale=PIXEL_SCALE, seed=0)
    buf.add(exact, np.zeros(20), np.zeros(20), exact, np.zeros(20), np.ones(20))
    saved = {k: v.clone() for k, v in buf.state_tensors().items()}
    saved_json = json.loads(json.dumps(buf.state_json()))
    before = buf.gather(np.arange(20))
    switched = dict(saved)
    floats = exact.copy()
    floats[3, 1] = 0.5001
    switched["replay.obs"] = torch.from_numpy(floats)
    switched["replay.next_obs"] = saved["replay.next_obs"].float() * np.float32(PIXEL_SCALE)
    buf.load_state(switched, saved_json)
    assert buf.obs.dtype == torch.float32 and buf.obs_scale is None
    np.testing.assert_array_equal(buf.gather(np.arange(20)).obs.numpy(), floats)
    np.testing.assert_array_equal(buf.gather(np.arange(20)).next_obs.numpy(), exact)
    mixed = dict(saved)
    mixed["replay.obs"] = torch.from_numpy(floats)  # levels beside floats: values kept
    buf.load_state(mixed, saved_json)
    np.testing.assert_array_equal(buf.gather(np.arange(20)).next_obs.numpy(), exact)
    buf.load_state(saved, saved_json)  # the rollback
    assert buf.obs.dtype == torch.uint8 and buf.obs_scale == PIXEL_SCALE
    after = buf.gather(np.arange(20))
    assert torch.equal(after.obs, before.obs) and torch.equal(after.next_obs, before.next_obs)
