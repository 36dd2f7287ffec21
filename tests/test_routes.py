"""The route table: every route in one place, each behind the door its method needs."""

from __future__ import annotations

from collections import Counter

from lanes._http.app import CHAT, CHAT_PATH, ROUTES, STRAIGHT
from lanes._http.doors import GENAI, MESSAGES
from lanes._http.routes import Door

OPEN_PATHS = {"/health", "/ready", "/metrics", "/", "/favicon.ico"}  # as guard.py says
JOBS = {  # what may spend quota or money: from a known client, never a cross-site form
    CHAT_PATH,
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/embeddings",
    "/v1beta/models/{target:path}",  # Gemini's API: generateContent and its kin
    "/v1/models/{target:path}",  # the same, where google-genai sends them by default
}
#: a client's own batch work (its files and batches): a sender's, never a cross-site form's; an
#: upload (multipart) names its key even where none is configured
BATCHES = {
    "/v1/files/{file_id}",
    "/v1/batches",
    "/v1/batches/{batch_id}/cancel",
    "/v1/messages/batches",
    "/v1/messages/batches/{batch_id}",
    "/v1/messages/batches/{batch_id}/cancel",
}
UPLOADS = {"/v1/files"}


def test_every_state_changing_route_needs_an_admin_or_is_a_job():
    """A POST or DELETE is an admin's action (JSON, same origin), a job's or a client's batch
    work (its sender checked), or an upload (its key named)."""
    for row in ROUTES:
        if set(row.methods) - {"GET"}:
            door = Door.SENDER if row.path in JOBS | BATCHES else Door.ADMIN
            assert row.door is (Door.UPLOADER if row.path in UPLOADS else door), row.path
    assert {row.path for row in ROUTES if row.door is Door.SENDER} >= JOBS | BATCHES


def test_only_liveness_metrics_and_the_page_are_open():
    """No key is asked of exactly the routes guard.py names, and they are all reads."""
    open_rows = [row for row in ROUTES if row.door is Door.OPEN]
    assert {row.path for row in open_rows} == OPEN_PATHS
    assert all(row.methods == ("GET",) for row in open_rows)


def test_each_path_and_method_is_routed_once():
    """No row shadows another; the chat front door is the table's chat row."""
    pairs = Counter((row.path, method) for row in ROUTES for method in row.methods)
    assert max(pairs.values()) == 1
    assert CHAT in ROUTES and CHAT.path == CHAT_PATH and CHAT.methods == ("POST",)


def test_the_front_door_serves_rows_of_the_table():
    """What goes straight in, past Starlette's stack, is a POST row of the table, each path once:
    the same handler and door as Starlette would route it to."""
    assert all(row in ROUTES and row.methods == ("POST",) for row in STRAIGHT)
    assert len({row.path for row in STRAIGHT}) == len(STRAIGHT) == 3


def test_only_the_messages_routes_speak_the_messages_api():
    """A refusal is in the Messages API's shape on its routes, in OpenAI's everywhere else."""
    messages = {row.path for row in ROUTES if row.shape is MESSAGES}
    assert messages == {"/v1/messages", "/v1/messages/count_tokens"} | {
        row.path for row in ROUTES if row.path.startswith("/v1/messages/batches")
    }
    assert len(messages) == 6


def test_only_the_gemini_routes_speak_google_s_shape():
    """A refusal is in Google's shape on Gemini's routes (all under /v1beta/, and the methods of
    /v1/models/{model}:… that google-genai sends there), in no other."""
    google = {(row.path, row.methods) for row in ROUTES if row.shape is GENAI}
    assert google == {
        ("/v1beta/models", ("GET",)),
        ("/v1beta/models/{target:path}", ("GET",)),
        ("/v1beta/models/{target:path}", ("POST",)),
        ("/v1/models/{target:path}", ("POST",)),
    }
