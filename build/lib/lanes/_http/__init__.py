"""The sidecar: an OpenAI-compatible HTTP server (Starlette on hypercorn's trio worker)."""
