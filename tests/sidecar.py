"""A running sidecar over fake providers, for integration tests (it lives in
`lanes.harness.configs`)."""

from lanes.harness.configs import CLIENT_KEY, open_sidecar

__all__ = ["CLIENT_KEY", "open_sidecar"]
