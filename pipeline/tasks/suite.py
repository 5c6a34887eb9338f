"""A suite: several tasks in one job and one store, N episodes of each.

Episode indices carry their task (:class:`~demoforge.stages.records.EpisodeLayout`: member ``t`` of a suite
owns indices ``t * STRIDE + k``), so every process — thread, process and Ray workers, replay — knows which
member an episode belongs to without a shared table, and a member's abandoned episode is replaced by another
index of the same member. The suite env is one member at a time: before each attempt's reset the executor calls
:meth:`TaskSuiteEnv.demo_select_episode`, which switches to the episode's member (building it, closing the one
before: members are run in blocks, so a worker builds each member about once) and names it as the episode's
task. Every member must record the same features (the suite's TaskInfo declares them).
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from demoforge.stages.records import EpisodeLayout


class TaskSuiteEnv(gym.Wrapper):
    """The env of a suite job: wraps the member its current episode belongs to (the first one until told)."""

    def __init__(self, members: tuple[str, ...], build: Callable[[str], gym.Env]) -> None:
        if not members:
            raise ValueError("a suite needs at least one member task")
        self.members = members
        self.layout = EpisodeLayout(len(members))
        self._build = build
        self.current = members[0]
        super().__init__(build(members[0]))

    def demo_select_episode(self, episode_index: int) -> str:
        """Become the member that owns ``episode_index``; its name is the episode's task."""
        group = self.layout.group(episode_index)
        if not 0 <= group < len(self.members):
            raise ValueError(f"episode index {episode_index} belongs to member {group} of a suite of "
                             f"{len(self.members)}")
        member = self.members[group]
        if member != self.current:
            self.env.close()
            self.env = self._build(member)
            self.current = member
        return member
