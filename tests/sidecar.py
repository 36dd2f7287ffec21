"""A running sidecar over fake providers, for integration tests (lives in lanes.testing.configs)."""

from lanes.testing.configs import CLIENT_KEY, open_sidecar

__all__ = ["CLIENT_KEY", "open_sidecar"]
