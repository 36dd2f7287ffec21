"""attrs validators shared by every config class: each error names the key, the rule and the
value."""

from __future__ import annotations

# lanes: pure
import math
from collections.abc import Callable
from typing import Any

import attrs

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def at_least(minimum: float, *, hint: str = "") -> Validator:
    """`value >= minimum` (None passes: the key is unset). NaN and infinity never pass."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is None:
            return
        if isinstance(value, float) and not math.isfinite(value) or not value >= minimum:
            raise ValueError(
                f"{attribute.name}: must be >= {minimum:g} (got {_shown(value)}){hint}"
            )

    return check


def above(minimum: float) -> Validator:
    """`value > minimum` (None passes). NaN and infinity never pass."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is None:
            return
        if isinstance(value, float) and not math.isfinite(value) or not value > minimum:
            raise ValueError(f"{attribute.name}: must be > {minimum:g} (got {_shown(value)})")

    return check


def at_most(maximum: float) -> Validator:
    """`value <= maximum` (None passes). NaN never passes."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is None:
            return
        if not value <= maximum:
            raise ValueError(f"{attribute.name}: must be <= {maximum:g} (got {_shown(value)})")

    return check


def _shown(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:g}"
    return repr(value)


non_negative = at_least(0)
positive = above(0)
