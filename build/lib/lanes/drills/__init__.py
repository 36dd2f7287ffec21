"""The drills: fake providers that fail on purpose, the scenarios that use them, and their
runner."""
