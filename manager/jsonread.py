"""JSON text from a file or a header as one error naming where it came from, never a crash.

Malformed JSON, bytes that are not UTF-8, nesting past the parser's stack (RecursionError) and
integers longer than CPython converts (ValueError past 4300 digits) each become one `error` line
starting with `where`. The caller bounds the bytes first (state.read_bounded, a header's length).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import ManagerError


def parse_json(data: bytes, where: str, error: type[ManagerError]) -> Any:
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{where}: line {exc.lineno}: malformed JSON: {exc.msg}") from exc
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read") from None
    except ValueError as exc:  # an integer longer than CPython converts (4300 digits)
        raise error(f"{where}: unreadable JSON: {str(exc)[:80]}") from None
