"""The quality canary: pinned prompts, stored answers, a scheduled diff (see the canary issue)."""
