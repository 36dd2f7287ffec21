"""What a job's request encodes to, worked out once for it and the copies `attrs.evolve` makes of
it (they share one `Memo`). Pure."""

from __future__ import annotations

# lanes: pure
import hashlib
import json
import weakref
from collections.abc import Callable
from typing import Any

import attrs

#: Upstream bodies a memo keeps: a candidate's, its retry's and a few more.
KEPT_BODIES = 4


@attrs.define(eq=False, repr=False)
class Memo:
    """What a job's request encodes to, kept for the copies `attrs.evolve` makes of the job (they
    share this object) while their messages (or input) and tools are the very same objects: a
    512 KB request is encoded once for its size, not once per candidate and attempt, and once for
    its digest. A copy with other messages or tools finds them changed and encodes its own."""

    sized: tuple[Any, ...] | None = None
    size: int = 0
    digested: tuple[Any, ...] | None = None
    digest: tuple[str, int] = ("", 0)
    plain: bool = False  # the request came as strict JSON with no float (`Job.arrived`)
    valid: tuple[Any, ...] | None = None  # the messages `Job` checked last, by identity
    # a plain translated request's messages and tools, encoded when it arrived, and of what
    parts: tuple[bytes, bytes] | None = None
    parted: tuple[Any, ...] | None = None
    # the upstream bodies encoded: (the job, held weakly, its key, the bytes), the last few
    bodies: list[tuple[weakref.ref[Any], tuple[Any, ...], bytes]] = attrs.field(factory=list)

    def checked(self, messages: tuple[Any, ...]) -> bool:
        """Whether `messages` (the very tuple) were checked already; from now on they are."""
        if self.valid is messages:
            return True
        self.valid = messages
        return False

    def size_of(self, of: tuple[Any, ...], what: Any) -> int:
        """The byte length of `what` as JSON, where `of` (the objects it is made from) are those
        of the last call, by identity; else worked out."""
        if not _same(self.sized, of):
            self.size = len(json.dumps(what, ensure_ascii=False, default=str).encode())
            self.sized = of
        return self.size

    def digest_of(self, of: tuple[Any, ...], what: Any) -> tuple[str, int]:
        if not _same(self.digested, of):
            self.digest = digest(what)
            self.digested = of
        return self.digest

    def arrived(
        self,
        *,
        digested: tuple[Any, ...],
        digest: tuple[str, int],
        sized: tuple[Any, ...] | None,
        size: int,
        plain: bool,
        parts: tuple[bytes, bytes] | None = None,
    ) -> None:
        """Figures a door worked out from the request's bytes as they arrived (`Job.arrived`),
        for the objects in `digested` and `sized` (None: no size; the `parts` encoded, of the
        same objects)."""
        self.digested, self.digest, self.plain = digested, digest, plain
        if sized is not None:
            self.sized, self.size = sized, size
            self.parts, self.parted = parts, sized if parts is not None else None

    def parts_of(self, of: tuple[Any, ...]) -> tuple[bytes, bytes] | None:
        """The messages and tools encoded when the request arrived, if `of` are those objects."""
        return self.parts if _same(self.parted, of) else None

    def encoded(self, job: Any, key: tuple[Any, ...], make: Callable[[], bytes]) -> bytes:
        """What `make` encodes of `job` (one of the copies sharing this memo) for `key`: worked
        out once, the last `KEPT_BODIES` kept. The job is held weakly, so the memo (which the job
        holds) makes no cycle the collector would have to find."""
        for ref, kept, raw in self.bodies:
            if ref() is job and kept == key:
                return raw
        raw = make()
        self.bodies = [*self.bodies[1 - KEPT_BODIES :], (weakref.ref(job), key, raw)]
        return raw


def _same(kept: tuple[Any, ...] | None, of: tuple[Any, ...]) -> bool:
    if kept is None or len(kept) != len(of):
        return False
    return all(a is b for a, b in zip(kept, of, strict=True))


def digest(value: Any) -> tuple[str, int]:
    """SHA-256 hex and byte length of a JSON value's canonical encoding."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate from outside must not crash this
    return hashlib.sha256(raw).hexdigest(), len(raw)
