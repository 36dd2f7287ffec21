"""The most jobs any router could have served free: an upper bound on a replay's free share.

It knows every arrival in advance and every quota exactly, and may send each job to any free
candidate its plan held, in any minute between its arrival and its deadline. Its value is the
maximum flow of the network

    source → (arrival minute, last minute, candidates) [jobs arriving so]
           → (scope, minute) for each candidate scope and each minute the job may be sent in
           → (scope, day) [the scope's requests a minute] → sink [its requests a day]

computed exactly (Dinic's algorithm). A job with a candidate that no stated quota limits (a local
lane, a lane whose limits its config does not state), or that may wait more than a day, counts as
free at once. Token, monthly and
credit limits are left out: relaxing a limit only raises the bound, so it stays an upper bound on
every replay under the same quotas — the tests check it never falls below one.
"""

from __future__ import annotations

# lanes: pure
from collections import Counter, deque
from collections.abc import Iterable, Mapping

import attrs

INFINITE = float("inf")


@attrs.frozen(kw_only=True)
class Need:
    """One job, as the bound sees it."""

    arrived: float  # epoch seconds
    deadline_s: float
    scopes: frozenset[str]  # the quota scopes of the free candidates its plan held
    unlimited: bool  # one of those candidates is limited by no stated quota


@attrs.frozen(kw_only=True)
class ScopeLimits:
    rpm: int | None
    rpd: int | None


#: A job that may wait longer than this (seconds) counts as free at once: the bound stays an upper
#: bound, and the network stays the size of a day's minutes per job at most.
HORIZON_S = 86400.0


def bound(needs: Iterable[Need], limits: Mapping[str, ScopeLimits]) -> int:
    """The most of `needs` servable free under `limits` (a scope missing from it: unlimited)."""
    free = 0
    groups: Counter[tuple[int, int, frozenset[str]]] = Counter()
    for need in needs:
        if (
            need.unlimited
            or any(s not in limits for s in need.scopes)
            or not need.deadline_s <= HORIZON_S  # a day or more to wait (or nan): relaxed
        ):
            free += 1
        elif need.scopes:
            first = int(need.arrived // 60)
            last = int((need.arrived + max(0.0, need.deadline_s)) // 60)
            groups[(first, last, need.scopes)] += 1
    return free + _flow(groups, limits)


def _flow(
    groups: Counter[tuple[int, int, frozenset[str]]], limits: Mapping[str, ScopeLimits]
) -> int:
    if not groups:
        return 0
    graph = _Graph()
    source, sink = graph.node(), graph.node()
    blocks: dict[tuple[str, int, int], int] = {}  # (scope, level, n): minutes n·2^level onwards
    days: dict[tuple[str, int], int] = {}

    def block(scope: str, level: int, n: int) -> int:
        """The node reaching the 2^level minutes from n·2^level: a minute's own node at level 0
        (to its day, at most rpm), else one to its two halves (each minute once: the network
        holds at most two nodes a minute a scope, however long the jobs' windows)."""
        key = (scope, level, n)
        node = blocks.get(key)
        if node is not None:
            return node
        node = blocks[key] = graph.node()
        if level:
            graph.edge(node, block(scope, level - 1, 2 * n), INFINITE)
            graph.edge(node, block(scope, level - 1, 2 * n + 1), INFINITE)
            return node
        day = (scope, n // 1440)
        day_node = days.get(day)
        if day_node is None:
            day_node = days[day] = graph.node()
            rpd = limits[scope].rpd
            graph.edge(day_node, sink, INFINITE if rpd is None else rpd)
        rpm = limits[scope].rpm
        graph.edge(node, day_node, INFINITE if rpm is None else rpm)
        return node

    for (first, last, scopes), count in groups.items():
        group = graph.node()
        graph.edge(source, group, count)
        for scope in sorted(scopes):
            for level, n in _cover(first, last):
                graph.edge(group, block(scope, level, n), count)
    return int(graph.max_flow(source, sink))


def _cover(first: int, last: int) -> list[tuple[int, int]]:
    """The fewest aligned blocks (level, n) covering the minutes first..last: O(log) of them."""
    found, at, end = [], first, last + 1
    while at < end:
        level = 0
        while at % (2 ** (level + 1)) == 0 and at + 2 ** (level + 1) <= end:
            level += 1
        found.append((level, at >> level))
        at += 2**level
    return found


class _Graph:
    """A flow network for Dinic's algorithm (adjacency lists of edge indices; edge i ^ 1 is i's
    reverse)."""

    def __init__(self) -> None:
        self.adjacent: list[list[int]] = []
        self.to: list[int] = []
        self.capacity: list[float] = []

    def node(self) -> int:
        self.adjacent.append([])
        return len(self.adjacent) - 1

    def edge(self, a: int, b: int, capacity: float) -> None:
        self.adjacent[a].append(len(self.to))
        self.to.append(b)
        self.capacity.append(capacity)
        self.adjacent[b].append(len(self.to))
        self.to.append(a)
        self.capacity.append(0.0)

    def max_flow(self, source: int, sink: int) -> float:
        total = 0.0
        while True:
            level = self._levels(source, sink)
            if level[sink] < 0:
                return total
            cursor = [0] * len(self.adjacent)
            while True:
                pushed = self._push(source, sink, level, cursor)
                if pushed <= 0:
                    break
                total += pushed

    def _levels(self, source: int, sink: int) -> list[int]:
        level = [-1] * len(self.adjacent)
        level[source] = 0
        queue = deque([source])
        while queue:
            node = queue.popleft()
            for e in self.adjacent[node]:
                if self.capacity[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[node] + 1
                    queue.append(self.to[e])
        return level

    def _push(self, source: int, sink: int, level: list[int], cursor: list[int]) -> float:
        """One augmenting path along the level graph (iteratively), its bottleneck pushed."""
        path: list[int] = []  # edge indices from the source
        node = source
        while True:
            if node == sink:
                flow = min(self.capacity[e] for e in path)
                for e in path:
                    self.capacity[e] -= flow
                    self.capacity[e ^ 1] += flow
                return flow
            edges = self.adjacent[node]
            while cursor[node] < len(edges):
                e = edges[cursor[node]]
                if self.capacity[e] > 0 and level[self.to[e]] == level[node] + 1:
                    break
                cursor[node] += 1
            else:  # a dead end: retreat, and never come this way again in this phase
                if not path:
                    return 0.0
                level[node] = -1
                e = path.pop()
                node = self.to[e ^ 1]
                cursor[node] += 1
                continue
            path.append(edges[cursor[node]])
            node = self.to[edges[cursor[node]]]
