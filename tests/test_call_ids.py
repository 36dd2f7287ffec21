"""A tool call's extra content carried in the id a client is given, pure: what is minted comes back
exactly, any other id is itself, the id stays one a Messages client accepts, and the size is
bounded."""

from __future__ import annotations

import base64
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from lanes._core.dialects.call_ids import MAX_PAYLOAD, minted, restored

#: The Messages API's tool_use id (Claude Code checks it).
ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")
SIGNATURES = st.binary(min_size=1, max_size=600).map(lambda b: base64.b64encode(b).decode())
ID_CHARACTERS = "abcXYZ019_-"
UPSTREAM_IDS = st.text(max_size=20) | st.text(ID_CHARACTERS, min_size=1, max_size=40)
SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
)
JSON = SCALARS | st.lists(SCALARS, max_size=3) | st.dictionaries(st.text(max_size=5), SCALARS)
EXTRAS = st.one_of(
    SIGNATURES.map(lambda s: {"google": {"thought_signature": s}}),
    st.dictionaries(st.text(max_size=8), JSON, min_size=1, max_size=3),
)
CLIENT_IDS = st.one_of(
    st.text(),
    st.text(ID_CHARACTERS, max_size=30).map(lambda tail: f"toolu_{tail}"),
    # the form's shape around a payload that is not one lanes made
    st.builds(
        lambda head, payload, length: f"{head}_{payload}_xc{length}",
        st.text(max_size=6),
        st.text("eyJaz09_-", max_size=40),
        st.integers(0, 2 * MAX_PAYLOAD),
    ),
)


@settings(max_examples=examples(100))
@given(UPSTREAM_IDS, EXTRAS)
def test_what_is_minted_comes_back_exactly(call_id, extra):
    """Any upstream id and extra content within the bound: the id a client is given restores both,
    exactly; and an upstream id that matches the Messages API's `^[a-zA-Z0-9_-]+$` still does."""
    carried = minted(call_id, extra)
    assert restored(carried) == (call_id, extra)
    assert ANTHROPIC_ID.fullmatch(carried) or not ANTHROPIC_ID.fullmatch(call_id)


@given(CLIENT_IDS)
def test_any_other_id_is_itself(client_id):
    """An id lanes did not mint (a client's own, a malformed payload, a length that lies, one over
    the bound) is the call's id as it is, with no extra content: never an error. The only other
    reading is exactly what mints that id."""
    call_id, extra = restored(client_id)
    assert (call_id, extra) == (client_id, None) or minted(call_id, extra) == client_id


def test_nothing_to_carry_leaves_the_id_alone():
    """No extra content, an empty one or one that is not an object: the upstream's id, untouched."""
    nothing: Any = (None, {}, [], "x")
    assert [minted("call_1", extra) for extra in nothing] == ["call_1"] * 4


def test_a_payload_over_the_bound_is_not_carried():
    """A signature too long for the bound: the client gets the upstream's id alone (its next turn
    goes without it); an id claiming a payload that long is a client's own."""
    at_bound: Any = {"google": {"thought_signature": "A" * 12_250}}
    over: Any = {"google": {"thought_signature": "A" * 12_300}}
    carried = minted("c1", at_bound)
    assert len(carried) <= len("c1") + MAX_PAYLOAD + 10 and restored(carried) == ("c1", at_bound)
    assert minted("c1", over) == "c1"
    claimed = f"c1_{'A' * (MAX_PAYLOAD + 4)}_xc{MAX_PAYLOAD + 4}"
    assert restored(claimed) == (claimed, None)


def test_a_damaged_payload_is_no_extra_content():
    """A payload with a character changed, cut short, or padded: the id as it came."""
    carried = minted("function-call-1", {"google": {"thought_signature": "c2ln"}})
    head, _, tail = carried.rpartition("_")
    damaged = [
        carried.replace("eyJ", "eyK", 1),
        f"{head[:-1]}_{tail}",
        f"{head}=_{tail}",
        carried.replace("_xc", "_xc0", 1),
    ]
    assert [restored(d) for d in damaged] == [(d, None) for d in damaged]
