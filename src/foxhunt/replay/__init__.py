"""Experience replay: uniform, prioritized (sum tree) and n-step accumulation."""

from foxhunt.replay.nstep import NStepAccumulator, Transitions
from foxhunt.replay.prioritized import PrioritizedReplayBuffer
from foxhunt.replay.sum_tree import SumTree
from foxhunt.replay.uniform import ReplayBuffer

__all__ = ["NStepAccumulator", "PrioritizedReplayBuffer", "ReplayBuffer", "SumTree", "Transitions"]
