"""Job specs as Python dicts: read from a dict, a TOML string or a path, and written as the
TOML the engine reads (`docs/spec.md`)."""

import datetime
import json
import os

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib


def load(spec):
    """A spec as a new dict, from a dict, a TOML string or a path to a TOML file."""
    if isinstance(spec, dict):
        # numpy scalars as their Python values, anything else (dates) as text.
        return json.loads(json.dumps(spec, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and "\n" not in spec and spec.endswith(".toml")):
        with open(spec, "rb") as f:
            return tomllib.load(f)
    if isinstance(spec, str):
        return tomllib.loads(spec)
    raise TypeError(f"a spec is a dict, a TOML string or a path, not {type(spec).__name__}")


def dumps(spec):
    """The TOML text of a spec dict: its plain values first, then its tables and arrays of
    tables, as the engine's own drafts lay them out."""
    lines = []
    _table(spec, [], lines)
    return "\n".join(lines) + "\n"


def _table(table, path, lines):
    tables = []
    for key, value in table.items():
        if isinstance(value, dict):
            tables.append((key, value, False))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append((key, value, True))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value, array in tables:
        name = ".".join(_key(k) for k in path + [key])
        for item in value if array else [value]:
            lines.append("")
            lines.append(f"[[{name}]]" if array else f"[{name}]")
            _table(item, path + [key], lines)


def _key(key):
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)


def _value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else _special(value)
    if isinstance(value, str):
        # TOML's basic strings take JSON's escapes, and DEL escaped too.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"a spec value cannot be a {type(value).__name__}")


def _special(value):
    return "nan" if value != value else ("inf" if value > 0 else "-inf")
