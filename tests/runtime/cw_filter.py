"""A small evaluator for the subset of CloudWatch Logs JSON filter patterns our metric filters use.

Our own stand-in for CloudWatch Logs, which does not run offline (moto stores filters but never applies
them); it follows the pattern syntax AWS documents for JSON log events.

Grammar (CloudWatch's, reduced): ``{ EXPR }`` where EXPR is terms joined by ``&&`` / ``||`` with
parentheses, and a term is ``$.path OP VALUE``: OP one of = != < > <= >=, VALUE a double-quoted string,
a number, or ``*`` (the field exists); or ``$.path IS TRUE`` / ``IS FALSE`` (a JSON boolean). Like CloudWatch, a log event that is not a JSON object matches
no JSON pattern, and a missing field makes its term false.
"""

from __future__ import annotations

import json
import re
from typing import Any

_TOKEN = re.compile(r'\s*(\{|\}|\(|\)|&&|\|\||<=|>=|!=|=|<|>|IS|TRUE|FALSE|\$\.[A-Za-z0-9_.\[\]]+|"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|\*)')


class PatternError(ValueError):
    pass


def _tokens(pattern: str) -> list[str]:
    out, pos = [], 0
    pattern = pattern.strip()
    while pos < len(pattern):
        m = _TOKEN.match(pattern, pos)
        if not m:
            raise PatternError(f"cannot read pattern at {pattern[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


def _lookup(event: Any, path: str) -> tuple[bool, Any]:
    node = event
    for part in re.findall(r"[^.\[\]]+", path[2:]):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _compare(found: bool, actual: Any, op: str, raw: str) -> bool:
    if not found:
        return False
    if raw == "*":
        return op == "="
    if raw.startswith('"'):
        expected = json.loads(raw)
        if op == "=":
            return isinstance(actual, str) and actual == expected
        if op == "!=":
            return not (isinstance(actual, str) and actual == expected)
        raise PatternError(f"operator {op} needs a number")
    number = float(raw)
    if isinstance(actual, bool) or not isinstance(actual, (int, float)):
        return op == "!="
    return {"=": actual == number, "!=": actual != number, "<": actual < number, ">": actual > number,
            "<=": actual <= number, ">=": actual >= number}[op]


def matches(pattern: str, line: str) -> bool:
    toks = _tokens(pattern)
    if not toks or toks[0] != "{" or toks[-1] != "}":
        raise PatternError("a JSON pattern is enclosed in { }")
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return False
    if not isinstance(event, dict):
        return False
    pos = 1

    def expr() -> bool:
        nonlocal pos
        value = term()
        while toks[pos] in ("&&", "||"):
            op = toks[pos]
            pos += 1
            rhs = term()
            value = (value and rhs) if op == "&&" else (value or rhs)
        return value

    def term() -> bool:
        nonlocal pos
        if toks[pos] == "(":
            pos += 1
            value = expr()
            if toks[pos] != ")":
                raise PatternError("missing )")
            pos += 1
            return value
        path, op, raw = toks[pos], toks[pos + 1], toks[pos + 2]
        if op == "IS" and raw in ("TRUE", "FALSE"):
            pos += 3
            found, actual = _lookup(event, path)
            return found and actual is (raw == "TRUE")
        if not path.startswith("$.") or op not in ("=", "!=", "<", ">", "<=", ">="):
            raise PatternError(f"bad term {path} {op} {raw}")
        pos += 3
        return _compare(*_lookup(event, path), op, raw)

    result = expr()
    if toks[pos] != "}" or pos != len(toks) - 1:
        raise PatternError("trailing tokens")
    return result


def metric_value(selector: str, line: str) -> float:
    """What a metric filter with ``metricValue=selector`` publishes for a matching line."""
    if re.fullmatch(r"-?\d+(?:\.\d+)?", selector):
        return float(selector)  # a literal value: each matching line counts it
    found, value = _lookup(json.loads(line), selector)
    if not found or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PatternError(f"{selector} is not a number in {line}")
    return float(value)
