"""The checks every construct prop goes through: integers, numbers, fractions, durations and choices.

Each raises :class:`ConfigError` as ``<field>: got <value>; allowed: <what>`` and returns the value it
checked. A value that is an unresolved token (a reference to another construct's attribute, a parameter) is
only known at deploy time: it passes unchecked here, and CloudFormation or SageMaker judge it then.
"""

from __future__ import annotations

from typing import Iterable, TypeVar

from aws_cdk import Duration, Token

from peagle_constructs.errors import ConfigError

T = TypeVar("T")


def is_unresolved(value: object) -> bool:
    """True for a CDK token (a string, a number or a Duration that only deploy time resolves)."""
    if isinstance(value, Duration):
        return value.is_unresolved()
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and Token.is_unresolved(value)


def _is_number(value: object, kind: type | tuple[type, ...]) -> bool:
    return not isinstance(value, bool) and isinstance(value, kind)


def check_int(value: object, field_name: str, low: int, high: int | None = None, *, allowed: str | None = None) -> int:
    """An integer in ``low..high`` (no upper bound when ``high`` is None)."""
    if is_unresolved(value):
        return value  # type: ignore[return-value]
    if not _is_number(value, int) or value < low or (high is not None and value > high):
        what = allowed or (f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}")
        raise ConfigError(field_name, f"got {value!r}; allowed: {what}")
    return value


def check_number(value: object, field_name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, allowed: str) -> float:
    """An int or float within the bounds given (``*_open``: the bound itself is excluded)."""
    if is_unresolved(value):
        return value  # type: ignore[return-value]
    ok = _is_number(value, (int, float))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise ConfigError(field_name, f"got {value!r}; allowed: {allowed}")
    return value


def check_positive(value: object, field_name: str, allowed: str = "a positive number") -> float:
    return check_number(value, field_name, low=0, low_open=True, allowed=allowed)


def check_duration(value: object, field_name: str, low_s: float, high_s: float) -> int:
    """A Duration of ``low_s..high_s`` seconds; returns its whole seconds (what CloudFormation takes)."""
    if not isinstance(value, Duration):
        raise ConfigError(field_name, f"got {value!r}; allowed: an aws_cdk.Duration of {low_s:.10g}..{high_s:.10g} s")
    if value.is_unresolved():
        return value.to_seconds()  # a token: CDK renders it as such
    seconds = value.to_seconds()
    if not low_s <= seconds <= high_s:
        raise ConfigError(field_name, f"got {seconds:.10g} s; allowed: {low_s:.10g}..{high_s:.10g} s")
    return int(seconds)


def check_choice(value: T, field_name: str, choices: Iterable[object]) -> T:
    choices = tuple(choices)
    if is_unresolved(value):
        return value
    if value not in choices:
        raise ConfigError(field_name, f"got {value!r}; allowed: one of {choices}")
    return value


def check_type(value: T, field_name: str, kind: type, allowed: str) -> T:
    if not isinstance(value, kind):
        raise ConfigError(field_name, f"got {value!r}; allowed: {allowed}")
    return value


def check_order(low: object, high: object, low_name: str, high_name: str) -> None:
    """``low <= high`` when both are known numbers."""
    if _is_number(low, (int, float)) and _is_number(high, (int, float)) and not is_unresolved(low) \
            and not is_unresolved(high) and low > high:
        raise ConfigError(low_name, f"got {low} > {high_name.rsplit('.', 1)[-1]} {high}; allowed: "
                          f"{low_name.rsplit('.', 1)[-1]} <= {high_name.rsplit('.', 1)[-1]}")
