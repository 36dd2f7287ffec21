"""Jobs in: the record that enters the dispatcher's one door (what comes out of it — the
candidates tried, the attempts, the reply — is `candidates.py`).

Pure: no I/O, no clock of its own. Times are floats on trio's clock (`*_at`) or durations in
seconds (`*_s`); the dispatcher turns a job's relative `deadline_s` into an absolute deadline once,
when the job enters.
"""

from __future__ import annotations

# lanes: pure
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from lanes._core.model.arrival import COUNTED_FROM, encoded, spliced, written
from lanes._core.model.clocks import TrioTime
from lanes._core.model.memo import Memo
from lanes._core.model.memo import digest as digest  # (the audit's, for an answer too)
from lanes._core.model.traceparent import normalised

Privacy = Literal["any", "zdr", "local"]


def _as_messages(value: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(value)


#: What an embedding job embeds, as OpenAI's `input`: a string, a list of token ids, or a list of
#: either.
EmbeddingInput = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


def _check_input(value: Any) -> None:
    if isinstance(value, str):
        if not value:
            raise ValueError("input: must not be an empty string")
        return
    if not isinstance(value, Sequence) or not value:
        raise ValueError("input: expected a string, a list of strings or a list of token ids")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise ValueError(f"input[{i}]: must not be an empty string")
        elif not (
            isinstance(item, Sequence)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        ):
            raise ValueError(f"input[{i}]: expected a string or a non-empty list of token ids")


#: A version-4 UUID's fixed bits: what `uuid.uuid4().hex` sets, without building a UUID object.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def _new_id() -> str:
    """A random version-4 UUID in hex, as `uuid.uuid4().hex` spells it."""
    return f"{int.from_bytes(os.urandom(16)) & _UUID4_CLEAR | _UUID4_SET:032x}"


#: What a translation left out of a request is kept by name, never by value: at most this many
#: names (the last one then says how many more), each at most this many characters.
MAX_DROPPED = 32
MAX_DROPPED_NAME = 64
#: The reasoning efforts a translated request may ask for (what every reasoning lane honours).
REASONING_EFFORTS = ("low", "medium", "high")


def bounded_names(names: Iterable[str]) -> tuple[str, ...]:
    """`names` once each, in order, as printable ASCII (anything else becomes `?`), cut to
    `MAX_DROPPED_NAME`; beyond `MAX_DROPPED` of them the last says `+N more`."""
    unique: dict[str, None] = {}  # ordered, and each look-up O(1): a body may hold 10^5 names
    for raw in names:
        name = "".join(c if " " <= c <= "~" else "?" for c in str(raw)[: MAX_DROPPED_NAME + 1])
        if len(name) > MAX_DROPPED_NAME:
            name = name[: MAX_DROPPED_NAME - 3] + "..."
        unique[name] = None
    seen = list(unique)
    if len(seen) > MAX_DROPPED:
        seen[MAX_DROPPED - 1 :] = [f"+{len(seen) - MAX_DROPPED + 1} more"]
    return tuple(seen)


@attrs.frozen(kw_only=True)
class Job:
    """One chat completion — or, with `input` instead of `messages`, one embedding — to route.

    `messages` and `params` are OpenAI's, passed through untouched (tools, temperature, seed, ...).
    `input` is what `dispatcher.embed()` embeds (OpenAI's embeddings `input`); such a job never
    goes to a different model, only to the same model on another lane.
    `model` is `"auto"`, an alias from config, `"lane/model"` or a bare model id.
    `dropped` names what the request held that was not sent (a translated API's fields, tools or
    blocks lanes does not carry), for the audit. `reasoning_effort` is an effort a translated
    request asked for: sent as chat's `reasoning_effort` only to a model that declares
    `reasoning` (a chat request's own params pass through untouched, that one included).
    The deadline is `deadline_at` (absolute, trio's clock) when given, else `deadline_s` from the
    moment the dispatcher receives the job.
    """

    messages: tuple[Mapping[str, Any], ...] = attrs.field(converter=_as_messages, default=())
    input: EmbeddingInput | None = None
    params: Mapping[str, Any] = attrs.field(factory=dict)
    model: str = "auto"
    deadline_s: float | None = attrs.field(default=None)
    deadline_at: float | None = None
    client: str = "anonymous"
    cohort: str | None = None
    request_class: str | None = None
    privacy: Privacy = "any"
    approval: str | None = None  # the approval a retry carries (X-Lanes-Approval), if any
    # never pays, whatever consent and the model named say: work that can wait (a batch item)
    free_only: bool = False
    # work that can wait on a budget of its own (a batch's `lanes_max_paid_usd`, what is left of
    # it): it may pay only under consent `allow`, each paid attempt's worst case at most this
    paid_cap_usd: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(0.0))
    )
    # the share (0..0.9) of every free quota this job leaves for interactive work (a batch item's
    # `batch.headroom`): to it a quota is used up that much earlier
    headroom: float = attrs.field(
        default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(0.9)]
    )
    # how long it may wait for a free quota to reopen (X-Lanes-Max-Wait), seconds: when every free
    # candidate is cooling and one reopens within it, the job waits instead of answering 429;
    # without a deadline of its own, its deadline grows by it
    max_wait_s: float | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(
            [attrs.validators.gt(0.0), attrs.validators.le(3600.0)]
        ),
    )
    # provider keys the client brought, by bring-your-own-key lane: used for this job only, never
    # sent anywhere else, stored, audited or printed
    keys: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    dropped: tuple[str, ...] = attrs.field(default=(), converter=bounded_names)
    reasoning_effort: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(REASONING_EFFORTS))
    )
    id: str = attrs.field(factory=_new_id)
    # what the request asks of the response cache (X-Lanes-Cache): `on` (read it, also where the
    # cache is write_only, and store this answer whatever its sampling), `off`, `refresh` (a fresh
    # answer replaces the entry); None: the cache's own rules
    cache: Literal["on", "off", "refresh"] | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.in_(("on", "off", "refresh"))),
    )
    # the caller's W3C `traceparent`: the job's span is its child (a malformed one is dropped)
    traceparent: str | None = attrs.field(default=None, converter=normalised)
    # sizes, digests and encodings already worked out (`Memo`): shared with the copies evolve
    # makes
    memo: Memo = attrs.field(factory=Memo, eq=False, repr=False, alias="_memo")

    @messages.validator
    def _check_messages(
        self, attribute: attrs.Attribute[tuple[Mapping[str, Any], ...]], value: tuple[Any, ...]
    ) -> None:
        if self.input is not None:
            if value:
                raise ValueError("a job has messages (a chat) or input (an embedding), not both")
            _check_input(self.input)
            return
        if not value:
            raise ValueError(
                "messages: must hold at least one message (or give input, for an embedding)"
            )
        if self.memo.checked(value):  # a copy `attrs.evolve` made, with the same messages
            return
        for i, message in enumerate(value):
            if (type(message) is not dict and not isinstance(message, Mapping)) or (
                "role" not in message
            ):
                raise ValueError(f"messages[{i}]: expected an object with a 'role'")

    @deadline_s.validator
    def _check_deadline_s(
        self, attribute: attrs.Attribute[float | None], value: float | None
    ) -> None:
        if value is not None and not value > 0:
            raise ValueError(f"deadline_s must be > 0 seconds (got {value!r})")

    def resolve_deadline(self, now: TrioTime, default_s: float) -> TrioTime:
        """The absolute deadline on trio's clock: `deadline_at`, else `now + deadline_s`, else
        `now + default_s` (and the free wait the job may spend, `max_wait_s`)."""
        if self.deadline_at is not None:
            return TrioTime(self.deadline_at)
        if self.deadline_s is not None:
            return TrioTime(now + self.deadline_s)
        return TrioTime(now + default_s + (self.max_wait_s or 0.0))

    @property
    def embedding(self) -> bool:
        """An embedding job (`input`), not a chat completion (`messages`)."""
        return self.input is not None

    def body(self, model: str, *, stream: bool = False, shared: bool = False) -> dict[str, Any]:
        """The upstream request body: the caller's params, its messages (or input), the model.
        Its messages are copies, unless `shared` (for a reader that changes none of them) and
        they are dicts already."""
        reserved = ("model", "messages", "stream", "input")
        body = {k: v for k, v in self.params.items() if k not in reserved}
        body["model"] = model
        if self.input is not None:
            body["input"] = self.request()
            return body
        messages = self.messages
        if shared and all(type(m) is dict for m in messages):
            body["messages"] = list(messages)
        else:
            body["messages"] = [dict(m) for m in messages]
        if stream:
            body["stream"] = True
        return body

    def request_fingerprint(self) -> str:
        """SHA-256 of what was asked — the model, the messages or an embedding's input, and every
        param (all that a paid attempt's worst case reads): a retry of the same request has the
        same one, any request that could cost more has another. An approval is for one of these."""
        embedded = None if self.input is None else self.request()
        asked = [self.model, list(self.messages), embedded, dict(self.params)]
        if self.reasoning_effort is not None:
            asked.append(self.reasoning_effort)
        return digest(asked)[0]

    def request(self) -> Any:
        """What the job sends, as JSON values: its messages, or an embedding's input."""
        if self.input is not None:
            return self.input if isinstance(self.input, str) else list(self.input)
        return list(self.messages)

    def fingerprint(self) -> tuple[str, int]:
        """SHA-256 and byte count of the messages (or input) — of the request's body as it
        arrived, for a job a door read (`arrived`): what the audit keeps instead of the body."""
        return self.memo.digest_of((self.input, self.messages), self.request())

    def arrived(self, raw: bytes, *, size: int | None = None, plain: bool = False) -> Job:
        """This chat job as a door read it from `raw` (its request's body, UTF-8 JSON): its digest
        is `raw`'s (SHA-256 and length, not its messages encoded again), and its input bytes are
        `size`, counted by the door from `raw` (`arrival.counted`) — or, `plain` (its messages
        and tools hold only what strict JSON gives, and no float), an upper bound worked out from
        a quick encoding of them (`arrival.written`); else (and for a request shorter than
        `arrival.COUNTED_FROM`), when asked, as any job's. Kept for its copies with the same
        messages and tools too; `plain` also says any JSON encoder may write it (`plain`).
        Returns the job."""
        tools = self.params.get("tools")
        parts = None
        if size is None and plain and self.input is None and len(raw) >= COUNTED_FROM:
            messages, listed = encoded(list(self.messages)), encoded(tools)
            if messages is not None and listed is not None:
                parts, size = (messages, listed), written(messages, listed)
        self.memo.arrived(
            digested=(self.input, self.messages),
            digest=(hashlib.sha256(raw).hexdigest(), len(raw)),
            sized=None if size is None or self.input is not None else (self.messages, tools),
            size=size or 0,
            plain=plain,
            parts=parts,
        )
        return self

    def body_bytes(self, model: str, *, stream: bool = False) -> bytes | None:
        """`body(model, stream=stream)` as a plain request's bytes, its messages and tools as
        `arrived` encoded them (once, whichever candidate and attempt sends them) after its other
        members; None when they were not encoded there (then `body` is encoded whole)."""
        tools = self.params.get("tools")
        parts = self.memo.parts_of((self.messages, tools))
        if parts is None:
            return None
        reserved = ("model", "messages", "stream", "input", "tools")
        head = {k: v for k, v in self.params.items() if k not in reserved}
        head["model"] = model
        start = encoded(head)
        if start is None:
            return None
        fields = [("tools", parts[1])] if "tools" in self.params else []
        fields.append(("messages", parts[0]))
        if stream:
            fields.append(("stream", b"true"))
        return spliced(start, fields)

    @property
    def plain(self) -> bool:
        """Its request came as strict JSON with no float in it (`arrived`): any JSON encoder
        writes it byte for byte as `json.dumps` does."""
        return self.memo.plain

    def encoded(self, key: tuple[Any, ...], make: Callable[[], bytes]) -> bytes:
        """What `make` encodes of this job for `key` (a lane, a model, the stream switch), worked
        out once: a retry sends the very bytes again."""
        return self.memo.encoded(self, key, make)

    def input_bytes(self) -> int:
        """Bytes of the messages and tools (or an embedding's input) as JSON — what a token
        estimate is made of."""
        if self.input is not None:
            return self.memo.size_of((self.input,), self.request())
        tools = self.params.get("tools")
        return self.memo.size_of((self.messages, tools), [self.messages, tools])
