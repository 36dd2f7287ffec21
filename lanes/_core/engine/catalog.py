"""The lanes a dispatcher loaded and their candidates: the pool (rebuilt when a catalog changes),
a job's model name resolved to candidates, and each lane's health — unreachable at startup until it
answers, and the requests to fetch its model list again."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Mapping, Sequence

import trio

from lanes._core.freetier.manager import LaneTerms
from lanes._core.model.candidates import Candidate
from lanes._core.model.errors import UnknownModel, Unservable, UpstreamError
from lanes._core.model.job import Job
from lanes._core.policy.pool import Pool
from lanes._core.policy.verdicts import wrong_kind
from lanes._core.upstream.lane import OpenAICompatibleLane

log = logging.getLogger("lanes")


class Catalog:
    """The loaded lanes and every candidate they offer, indexed once per catalog change."""

    def __init__(
        self,
        lanes: Sequence[OpenAICompatibleLane],
        *,
        aliases: Mapping[str, Sequence[str]],
        alias_patterns: Mapping[str, str],
        register: Callable[[str, LaneTerms], None],
    ) -> None:
        """`register` tells the FreeTierManager a lane's kind and its models' `free` flags (again
        when its catalog changes)."""
        self._lanes = {lane.name: lane for lane in lanes}
        self._aliases = aliases
        self._patterns = alias_patterns
        self._tell = register
        for lane in self._lanes.values():
            self._register(lane)
        self._pool = Pool(self._loaded(), aliases)

    @property
    def lanes(self) -> Mapping[str, OpenAICompatibleLane]:
        return self._lanes

    @property
    def pool(self) -> Pool:
        """The candidates as indexed now (a new `Pool` after every catalog change)."""
        return self._pool

    def _loaded(self) -> list[Candidate]:
        return [c for lane in self._lanes.values() for c in lane.candidates]

    def candidates(self) -> Sequence[Candidate]:
        """Every loaded candidate, in config order."""
        return self._pool.candidates

    def candidate(self, key: str) -> Candidate | None:
        return self._pool.by_key.get(key)

    def resolve(self, job: Job) -> Sequence[Candidate]:
        """The candidates for `job.model` — `auto`, an alias, `lane/model` or a bare model id — of
        the job's kind: embedding models for an embedding job, the others for a chat. A name with
        a date suffix (`name-20250514`) not known as such resolves to the alias `name`.

        An embedding job must name its model (`auto` would mix models whose vectors do not
        compare); an alias is how config declares the same model on several lanes.
        Raises `UnknownModel`, or `Unservable` for a model of the other kind."""
        pool = self._pool
        if job.model == "auto":
            if job.embedding:
                raise Unservable(
                    "an embedding needs a named model: 'auto' could mix models whose vectors are "
                    "not comparable; name the model, a lane/model or an alias",
                    param="model",
                )
            return pool.chat
        alias = self.alias_of(job.model)
        found: Sequence[Candidate]
        if alias is not None:
            found = pool.aliases.get(alias, ())
        elif job.model in pool.by_key:
            found = (pool.by_key[job.model],)
        else:
            found = pool.by_model.get(job.model, ())
            if not found:
                raise UnknownModel(
                    f"model {job.model!r} is not 'auto', an alias or a configured model"
                )
        fitting = [c for c in found if c.embedding == job.embedding]
        if found and not fitting:
            raise Unservable(wrong_kind(job.model, job.embedding), param="model")
        return fitting

    def alias_of(self, name: str) -> str | None:
        """The alias `name` stands for: itself; else, when `name` is no model's id, the alias it
        is without a date suffix (`-YYYYMMDD`), or the alias of the first of `alias_patterns`
        it matches (a glob, case-sensitive: `claude-*haiku*`) — so next month's model name is
        not a 404."""
        aliases = self._aliases
        if name in aliases:
            return name
        base, dash, date = name.rpartition("-")
        dated = dash and len(date) == 8 and date.isdigit() and base in aliases
        if not (dated or self._patterns):
            return None
        if name in self._pool.by_model or name in self._pool.by_key:
            return None  # an exact model id wins
        if dated:
            return base
        for pattern, alias in self._patterns.items():
            if fnmatch.fnmatchcase(name, pattern):
                return alias if alias in aliases else None
        return None

    def discovering(self) -> list[OpenAICompatibleLane]:
        return [lane for lane in self._lanes.values() if lane.config.discover]

    async def refresh_catalogs(self, until: float) -> bool:
        """Fetch every discovering lane's catalog now (bounded by `until`); True if any answered."""
        answered = []

        async def one(lane: OpenAICompatibleLane) -> None:
            try:
                await lane.refresh_catalog()
            except UpstreamError as exc:
                log.info("lane %s: catalog refresh failed (%s)", lane.name, exc)
                return
            self.catalog_changed(lane)
            answered.append(lane.name)

        with trio.move_on_at(until):
            async with trio.open_nursery() as nursery:
                for lane in self.discovering():
                    nursery.start_soon(one, lane)
        return bool(answered)

    def catalog_changed(self, lane: OpenAICompatibleLane) -> None:
        """`lane`'s candidates changed (its catalog was fetched): its terms, and the pool."""
        self._register(lane)
        self._pool = Pool(self._loaded(), self._aliases)

    def _register(self, lane: OpenAICompatibleLane) -> None:
        declared = {m.id: m.free for m in lane.models.values() if m.free is not None}
        terms = LaneTerms(
            kind=lane.spec.free_tier, conventions=lane.spec.conventions, declared=declared
        )
        self._tell(lane.name, terms)


class LaneHealth:
    """Whether each lane's provider answers: the lanes that accepted no connection at startup
    (until they answer), and the requests to fetch a lane's model list before its next round."""

    def __init__(self) -> None:
        self._unreachable: dict[str, str] = {}  # lane → why
        self._refresh: dict[str, trio.Event] = {}  # lane → set to wake its catalog refresh

    def unreachable(self, lane: str, why: str) -> None:
        self._unreachable[lane] = why

    def answered(self, lane: str) -> None:
        """`lane`'s provider answered: it is reachable."""
        self._unreachable.pop(lane, None)

    def why_unreachable(self, lane: str) -> str | None:
        return self._unreachable.get(lane)

    def next_refresh(self, lane: str) -> trio.Event:
        """What the catalog refresh of `lane` waits on until its next round: set when a request
        found its model gone."""
        event = self._refresh[lane] = trio.Event()
        return event

    def want_refresh(self, lane: str) -> None:
        """A model of `lane` may have left its catalog: fetch the list again now."""
        if (event := self._refresh.get(lane)) is not None:
            event.set()
