"""The candidates, indexed once per catalog change: by key, by model id, by alias, and — the chat
models — in groups of candidates that a plan's filters and the ranking's fit see alike. Pure.

A discovered catalog may list a thousand models, and a job is served by one of the first few it
tries: an `auto` plan (`autoplan.py`) checks and scores each group once, not each model.
"""

from __future__ import annotations

# lanes: pure
from collections.abc import Iterable, Mapping, Sequence

import attrs

from lanes._core.model.candidates import Candidate
from lanes._core.model.job import Job
from lanes._core.policy.needs import Needs
from lanes._core.policy.policy import PolicyConfig, unfit

TIERS = ("local", "byok", "free", "paid")


@attrs.frozen(kw_only=True)
class Group:
    """Candidates of one lane that the plan's filters and the ranking's fit see alike, as
    (config position, candidate), in config order."""

    members: tuple[tuple[int, Candidate], ...]

    @property
    def first(self) -> Candidate:
        return self.members[0][1]


def _shape(c: Candidate) -> tuple[object, ...]:
    """What `unfit`, `fit` and the walk's prefill filter read of a candidate (and its lane)."""
    return (
        c.lane,
        c.tier,
        c.context,
        c.max_output_tokens,
        c.tools,
        c.vision,
        c.json_mode,
        c.zdr,
        c.prefill,
    )


class Pool:
    """Every loaded candidate, indexed: by key, by model id, by alias, and (chat models) in groups
    for `AutoPlan`. Built once per catalog change; never changed after."""

    def __init__(self, candidates: Iterable[Candidate], aliases: Mapping[str, Sequence[str]]):
        self.candidates = tuple(candidates)
        self.by_key: dict[str, Candidate] = {}
        self.position: dict[str, int] = {}
        by_model: dict[str, list[Candidate]] = {}
        shapes: dict[tuple[object, ...], list[tuple[int, Candidate]]] = {}
        for i, c in enumerate(self.candidates):
            if c.key in self.by_key:
                continue
            self.by_key[c.key] = c
            self.position[c.key] = i
            by_model.setdefault(c.model, []).append(c)
            if not c.embedding:
                shapes.setdefault(_shape(c), []).append((i, c))
        self.by_model = {model: tuple(found) for model, found in by_model.items()}
        self.chat = tuple(c for c in self.candidates if not c.embedding)
        self.groups = tuple(Group(members=tuple(members)) for members in shapes.values())
        self.group_of = {c.key: g for g in self.groups for _, c in g.members}
        self.aliases = {
            alias: tuple(self.by_key[k] for k in keys if k in self.by_key)
            for alias, keys in aliases.items()
        }


def group_unfit(group: Group, job: Job, needs: Needs, privacy: str, policy: PolicyConfig) -> str:
    """Why a group's candidates can not serve `job` ("" when they can): `make_plan`'s filters."""
    first = group.first
    reason = unfit(first, needs, privacy)
    if reason is None and first.tier == "byok" and first.lane not in job.keys:
        reason = "bring-your-own-key lane: no key for it in the request"
    if reason is None and first.tier == "paid" and policy.free_tier_only:
        reason = "free_tier_only"
    return reason or ""
