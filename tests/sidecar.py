"""A running sidecar over fake providers, for integration tests (it lives in
`lanes.testing.harness.configs`)."""

from lanes.testing.harness.configs import CLIENT_KEY, open_sidecar

__all__ = ["CLIENT_KEY", "open_sidecar"]
