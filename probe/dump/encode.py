"""Dump files' text: dump.json entries, stack.json and construct.json as bytes.

Entries are encoded with orjson (~1 us an entry, against ~16 us for the standard
``json``), in the training process at flush points. orjson writes NaN and Infinity as
``null``, while msprobe's files carry bare ``NaN``/``Infinity`` (and its compare reads
them): an entry whose orjson text holds a ``null`` that may be a number is encoded again
with ``json``, which writes non-finite floats as msprobe does and None as ``null``. Values
orjson refuses (a non-str key, an int past 64 bits, a custom object) go through
``json`` too, unknown objects as their ``repr``: written, never lost.
"""
import json

import orjson

FOOTER = b"\n }\n}\n"



def _default(obj):
    """Records (``records.py``) as their dict; anything else unknown as its repr."""
    to_json = getattr(obj, "to_json", None)
    return to_json() if to_json is not None else repr(obj)


def _record_only(obj):
    return obj.to_json()   # AttributeError for other objects: orjson raises, json takes over


_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS
_orjson_dumps = orjson.dumps


def _dumps(value):
    return _orjson_dumps(value, _record_only, _OPTIONS)


# the slow path's text has orjson's separators, so a file reads alike whichever path wrote a line
_json_encode = json.JSONEncoder(check_circular=False, separators=(",", ":"), default=_default).encode


def encode_value(value):
    """One JSON value as bytes, non-finite floats as ``NaN``/``Infinity``."""
    try:
        data = _orjson_dumps(value, _record_only, _OPTIONS)
    except TypeError:   # orjson.JSONEncodeError is a TypeError
        return _json_encode(value).encode()
    if b"null" in data and _maybe_nonfinite(data):
        return _json_encode(value).encode()
    return data


def _maybe_nonfinite(data):
    """Whether a ``null`` in orjson's text may stand for a NaN or an infinity.

    A number sits under a key (``"Max":null``, ``"value":null``) or in a slice's bounds;
    a ``null`` elsewhere (``[null,...]``, ``,null``: a gradient that does not exist, a None
    argument) is a None, and orjson's text is already the file's. Entries with those (~15%
    of a model's backward entries) were encoded twice. An inference entry's per-token
    statistics (``"token_stats":[[Max,Min,Mean,Norm],...]``) hold numbers only: a ``null``
    there is a NaN or an infinity."""
    return b'":null' in data or b'"slice"' in data or _null_in_token_stats(data)


_TOKEN_STATS = b'"token_stats":'


def _null_in_token_stats(data):
    at = data.find(_TOKEN_STATS)
    while at >= 0:
        end = data.find(b"]]", at)
        if end < 0 or b"null" in data[at:end]:
            return True
        at = data.find(_TOKEN_STATS, end)
    return False


def encode_entries(count, entries):
    """The bytes that append ``entries`` ((name, body) pairs) to a "data" object holding
    ``count`` entries: one entry a line, each line after a comma but the very first."""
    parts = []
    add = parts.append
    first = not count
    for name, body in entries:
        add(b"\n  " if first else b",\n  ")
        first = False
        add(_dumps(name))
        add(b": ")
        add(encode_value(body))
    return b"".join(parts)


def one_key_per_line(obj):
    """Readable JSON at C speed: one key a line (construct.json)."""
    if not obj:
        return b"{}"
    return b"{\n" + b",\n".join(b" " + _dumps(str(k)) + b": " + encode_value(v) for k, v in obj.items()) + b"\n}\n"


def stack_text(parts):
    """stack.json's bytes from ``StackTable.parts()``: msprobe's grouped layout, one stack
    a line, each stack's frames as encoded (a JSON text) when it was first seen."""
    if not parts:
        return b"{}"
    return b"{\n" + b",\n".join(b' "%d": [%s, %s]' % (i, _dumps(list(names)), frames.encode())
                                 for i, (names, frames) in enumerate(parts)) + b"\n}\n"


def header_text(header):
    """dump.json's head up to the open "data" object, and its closing braces."""
    head = b"{\n" + b"".join(b" " + _dumps(k) + b": " + _dumps(v) + b",\n" for k, v in header.items())
    return head + b' "data": {' + FOOTER
