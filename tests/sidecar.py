"""A running sidecar over fake providers, for integration tests (it lives in drills.harness)."""

from drills.harness import CLIENT_KEY, open_sidecar

__all__ = ["CLIENT_KEY", "open_sidecar"]
