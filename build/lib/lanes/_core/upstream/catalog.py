"""Provider catalogs, normalised into one model record, and the free-detection rule. Pure.

A model is free only if the provider says so: zero prompt *and* completion price, a `:free`-style
name its free-tier kind covers, a kind that covers the whole provider, or the user's config. An
unknown price is not free. Entries that can not be read are skipped; the function never raises.
Prices and context windows are bounded (`prices.price`, `MAX_CONTEXT`): one beyond is unknown.
A model id must be printable ASCII without spaces, at most `MAX_ID` characters (it travels in
headers and URLs), and one that holds a known secret or looks like a key (`untrusted.holds_key`)
is not listed: a model id is shown everywhere. At most `MAX_MODELS` entries are read.
An embedding model is marked as one when the catalog says so (a `type`, an output modality) or its
id names it (`embed`), so no chat job is ever routed to it.
"""

from __future__ import annotations

# lanes: pure
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from lanes._core.freetier.kinds import FreeModelsOnly, FreeTierKind, NoFreeTier
from lanes._core.freetier.prices import bounded, price
from lanes._core.model.untrusted import holds_key, known_forms


@attrs.frozen(kw_only=True)
class ModelRecord:
    id: str
    context: int | None = None
    max_output_tokens: int | None = None  # the most output tokens the model allows
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    tools: bool | None = None
    vision: bool | None = None
    json_mode: bool | None = None
    reasoning: bool | None = None
    created: int | None = None  # when the provider says the model was created (epoch seconds)
    embedding: bool = False  # an embedding model: never a chat candidate

    @property
    def zero_priced(self) -> bool:
        return self.input_usd_per_mtok == 0.0 and self.output_usd_per_mtok == 0.0


MAX_CONTEXT = 1_000_000_000  # tokens: a larger context window is garbage, not a model
MAX_ID = 256
MAX_MODELS = 10_000
_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_ID}}}")


def _int(value: Any) -> int | None:
    number = bounded(value, 1.0, MAX_CONTEXT)
    return None if number is None else int(number)


def _entries(document: Any, secrets: tuple[str, ...]) -> list[Mapping[str, Any]]:
    items = document.get("data") if isinstance(document, Mapping) else document
    if isinstance(items, Mapping):
        items = items.get("models")
    if not isinstance(items, list):
        return []
    return [
        i
        for i in items[:MAX_MODELS]
        if isinstance(i, Mapping)
        and isinstance(i.get("id"), str)
        and _ID.fullmatch(i["id"])
        and not holds_key(i["id"], secrets)
    ]


def normalise(style: str, document: Any, secrets: Iterable[str] = ()) -> list[ModelRecord]:
    """The models a `GET …/models` document lists, in one shape. `style` names the document's shape:
    `openai` (`data[].id`, maybe a context), `per_token_prices` (prices per token as strings,
    supported parameters, input modalities), `per_mtok_prices` (a bare list, prices per million
    tokens, a `type`), `prefixed_ids` (ids like `models/<id>`). An id holding one of `secrets`
    (the lane's key) or shaped like a key is left out."""
    records = []
    for item in _entries(document, known_forms(secrets)):
        try:
            record = _record(style, item)
        except (TypeError, ValueError, AttributeError):
            continue
        records.append(
            attrs.evolve(
                record,
                created=_int(item.get("created")),
                embedding=_embedding(item),
                max_output_tokens=_max_output(item),
            )
        )
    return records


def _max_output(item: Mapping[str, Any]) -> int | None:
    """The most output tokens a catalog entry says the model allows (Groq's and OpenRouter's
    `max_completion_tokens`), or None."""
    top = item.get("top_provider")
    return _int(
        item.get("max_completion_tokens")
        or item.get("max_output_tokens")
        or (top.get("max_completion_tokens") if isinstance(top, Mapping) else None)
    )


def _embedding(item: Mapping[str, Any]) -> bool:
    """Whether the catalog entry is an embedding model: by its type, its output, or its name."""
    if item.get("type") in ("embedding", "embeddings"):
        return True
    architecture = item.get("architecture")
    outputs = architecture.get("output_modalities") if isinstance(architecture, Mapping) else None
    if isinstance(outputs, list) and any(o in ("embedding", "embeddings") for o in outputs):
        return True
    return "embed" in item["id"].lower()


def _record(style: str, item: Mapping[str, Any]) -> ModelRecord:
    model_id = item["id"]
    context = _int(
        item.get("context_length")
        or item.get("context_window")
        or item.get("max_context_length")
        or (item.get("top_provider") or {}).get("context_length")
    )
    if style == "per_token_prices":
        pricing = item.get("pricing") or {}
        parameters = set(item.get("supported_parameters") or [])
        modalities = set((item.get("architecture") or {}).get("input_modalities") or [])
        return ModelRecord(
            id=model_id,
            context=context,
            input_usd_per_mtok=price(pricing.get("prompt"), scale=1e6),
            output_usd_per_mtok=price(pricing.get("completion"), scale=1e6),
            tools="tools" in parameters if parameters else None,
            vision="image" in modalities if modalities else None,
            json_mode="response_format" in parameters if parameters else None,
            reasoning="reasoning" in parameters if parameters else None,
        )
    if style == "per_mtok_prices":
        if item.get("type") not in (None, "chat", "embedding", "embeddings"):
            raise ValueError("not a chat or embedding model")
        pricing = item.get("pricing") or {}
        return ModelRecord(
            id=model_id,
            context=context,
            input_usd_per_mtok=price(pricing.get("input")),
            output_usd_per_mtok=price(pricing.get("output")),
        )
    if style == "prefixed_ids":
        return ModelRecord(id=model_id.removeprefix("models/"), context=context)
    return ModelRecord(id=model_id, context=context)


def declared_free(record: ModelRecord, kind: FreeTierKind) -> bool | None:
    """What the catalog says about a model's price, for `tier_of`: True free, False paid, None
    "the kind decides" (a kind covering the whole provider, or a name the kind's patterns cover)."""
    if isinstance(kind, NoFreeTier):
        return False  # a provider with no free tier: its price list makes no model ours to use
    if record.zero_priced:
        return True
    if isinstance(kind, FreeModelsOnly):
        return bool(kind.covers(record.id))  # unknown or non-zero price: not free
    if record.input_usd_per_mtok or record.output_usd_per_mtok:
        return False
    return None
