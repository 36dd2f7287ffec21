"""Diff a run against the pinned baseline and score each model's drift. Pure.

Per prompt: whether a check that passed then fails now, exact match, a normalised similarity
(difflib ratio), and whether the reported model or system fingerprint changed. Per model a drift
score in [0, 1] and a verdict: `ok`, `drifted`, `failed` (checks that passed at pin time fail now,
or nothing answered) or `skipped` (not probed: backed off, low quota, breaker open).
"""

from __future__ import annotations

# lanes: pure
import difflib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from lanes.canary.checks import normalise

Verdict = Literal["ok", "drifted", "failed", "skipped"]


@attrs.frozen(kw_only=True)
class Answer:
    """One stored answer (or a skip) for one prompt on one model."""

    prompt: str
    status: Literal["ok", "error", "skipped"]
    text: str = ""
    checks: Mapping[str, bool] = attrs.field(factory=dict)
    reported_model: str = ""
    fingerprint: str = ""
    at: float = 0.0
    reason: str = ""


@attrs.frozen(kw_only=True)
class PromptDiff:
    prompt: str
    regressed: bool  # a check that passed at pin time fails now
    exact: bool
    similarity: float
    model_changed: bool
    excerpt_then: str = ""
    excerpt_now: str = ""


@attrs.frozen(kw_only=True)
class ModelReport:
    key: str
    verdict: Verdict
    drift: float
    diffs: tuple[PromptDiff, ...] = ()
    reason: str = ""
    changed_at: float | None = None
    at: float = 0.0  # when the run was made (wall-clock epoch seconds)


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, normalise(a), normalise(b)).ratio()


def diff_prompt(now: Answer, then: Answer) -> PromptDiff:
    regressed = any(then.checks.get(k) and not v for k, v in now.checks.items())
    return PromptDiff(
        prompt=now.prompt,
        regressed=regressed or (then.status == "ok" and now.status != "ok"),
        exact=now.text == then.text,
        similarity=similarity(now.text, then.text),
        model_changed=(now.reported_model, now.fingerprint)
        != (then.reported_model, then.fingerprint),
        excerpt_then=then.text[:120],
        excerpt_now=now.text[:120],
    )


def score_model(
    key: str,
    now: Sequence[Answer],
    baseline: Mapping[str, Answer],
    *,
    similarity_ok: float,
    drift_threshold: float,
) -> ModelReport:
    """The verdict for one model from its latest answers and its pinned ones."""
    answered = [a for a in now if a.status != "skipped"]
    if not answered:
        reason = next((a.reason for a in now if a.reason), "not probed")
        return ModelReport(key=key, verdict="skipped", drift=0.0, reason=reason)
    if all(a.status == "error" for a in answered):
        return ModelReport(key=key, verdict="failed", drift=1.0, reason="no prompt was answered")
    pinned = [a for a in answered if a.prompt in baseline]  # a new prompt has nothing to diff
    diffs = tuple(diff_prompt(a, baseline[a.prompt]) for a in pinned)
    if not diffs:
        return ModelReport(key=key, verdict="ok", drift=0.0, reason="no baseline yet: pin one")
    # a prompt whose answer moved below `similarity_ok` counts in full, a small rewording by how far
    # it moved; a changed reported model or fingerprint adds a step. The score is the mean.
    per_prompt = [
        (0.0 if d.exact else 1.0 if d.similarity < similarity_ok else 1.0 - d.similarity)
        + (0.25 if d.model_changed else 0.0)
        for d in diffs
    ]
    drift = min(1.0, sum(per_prompt) / len(per_prompt))
    first = min((a.at for a, d in zip(pinned, diffs, strict=True) if not d.exact), default=None)
    if any(d.regressed for d in diffs):
        return ModelReport(
            key=key,
            verdict="failed",
            drift=max(drift, drift_threshold),
            diffs=diffs,
            reason="checks that passed at pin time fail now",
            changed_at=first,
        )
    verdict: Verdict = "drifted" if drift >= drift_threshold else "ok"
    reason = f"drift {drift:.2f}" + (
        " (reported model or fingerprint changed)" if any(d.model_changed for d in diffs) else ""
    )
    return ModelReport(
        key=key, verdict=verdict, drift=drift, diffs=diffs, reason=reason, changed_at=first
    )


def summary(reports: Sequence[ModelReport]) -> dict[str, Any]:
    return {
        r.key: {"verdict": r.verdict, "drift": round(r.drift, 3), "reason": r.reason}
        for r in reports
    }
