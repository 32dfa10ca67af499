"""The one check of a JSON document a reader takes from S3 (a preflight, a final state): a JSON object whose known
fields have their types. A document that fails it raises ValueError naming the field, and each reader sets it aside
(chunks, preflights and rank documents are create-only: a bad one stays, so it must cost itself alone)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

NUMBER = (int, float)
FieldTypes = Mapping[str, type | tuple[type, ...]]


def json_object(body: bytes) -> dict[str, Any]:
    """`body` as a JSON object; ValueError saying what it is instead (torn, not text, a list)."""
    try:
        document = json.loads(body)
    except ValueError as error:  # torn, or not text at all
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(document, dict):
        raise ValueError(f"not a JSON object but {type(document).__name__}")
    return document


def checked_object(
    body: bytes, fields: FieldTypes, *, required: frozenset[str] = frozenset(), positive: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """`body` as a JSON object whose `fields` have their types (`required` ones present, `positive` ones finite and
    above 0); fields it does not know are kept (a newer writer's). ValueError, naming the field, otherwise."""
    document = json_object(body)
    for name, kind in fields.items():
        value = document.get(name)
        if value is None and name in required:
            raise ValueError(f"no field {name!r}")
        if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
            raise ValueError(f"{name}: {value!r} is not {getattr(kind, '__name__', 'a number')}")
        if isinstance(value, int | float) and name in positive and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: {value!r} is not a positive number")
    return document
