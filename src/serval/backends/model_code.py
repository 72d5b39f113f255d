"""Calling model code (a Python model's load, infer, unload): what it raises, named for the
client, and never sys.exit() or KeyboardInterrupt reaching the event loop, which would stop the
server (a real Ctrl-C reaches the loop's signal handler, never these calls)."""

from __future__ import annotations

import logging
from typing import Any

from serval.errors import shown

log = logging.getLogger(__name__)

# raised by model code, they fail its load or its request, like any other exception
MODEL_EXITS = (SystemExit, KeyboardInterrupt)

MODEL_ERROR_CHARS = 400


def model_exception(exc: BaseException) -> str:
    """What model code raised, as a client may read it: type and message on one line, cut to
    MODEL_ERROR_CHARS; sys.exit() and KeyboardInterrupt named as what they are."""
    if isinstance(exc, SystemExit):
        text = (f"SystemExit({shown(exc.code, 60)}): sys.exit() in model code does not stop "
                "the server")
    else:
        try:
            detail = str(exc)
        except Exception:  # a model's exception whose __str__ fails
            detail = ""
        text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= MODEL_ERROR_CHARS else text[:MODEL_ERROR_CHARS - 3] + "..."


def unload_instance(name: str, instance: Any) -> None:
    """The model's own unload(), if it has one; what it raises is logged (one line), never
    passed on: the version goes either way, and the server must go on."""
    unload = getattr(instance, "unload", None)
    if not callable(unload):
        return
    try:
        unload()
    except (Exception, *MODEL_EXITS) as exc:
        log.warning("model's unload() failed", extra={"model": name,
                                                       "error": model_exception(exc)})
