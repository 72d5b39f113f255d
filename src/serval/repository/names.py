"""What clients are told about model names: Triton's words for an unknown or unready model, the
names no model folder can have, and failure reasons with the filesystem's paths taken out."""

from __future__ import annotations

import re
from pathlib import Path

from serval.errors import InvalidInput, LoadFailed, ModelNotReady, ServalError
from serval.repository.served import ServedModel

UNKNOWN_MODEL = "Request for unknown model: "  # Triton's words, which clients match on
MAX_NAME_BYTES = 255  # a model name is a folder name: the filesystem's limit
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/[^\s'\"`:,;()\[\]{}<>]+")


def cut(text: str, limit: int = 64) -> str:
    """A client's model name or version string as an error message quotes it: as sent, or its
    first characters (a name of any length must not make an error message that long)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def not_ready_message(served: ServedModel, versioned: bool = True,
                      reason: str | None = None) -> str:
    """Triton's words for a model (version) that is known and not ready, then why (its
    reason now, or `reason`)."""
    why = served.reason if reason is None else reason
    reason = f" ({why})" if why else ""
    if versioned:
        return (f"{UNKNOWN_MODEL}'{served.name}' version {served.version} is not at ready "
                f"state{reason}")
    return (f"{UNKNOWN_MODEL}'{served.name}' has no available versions: version "
            f"{served.version} is {served.state.value}{reason}")


def check_requested_name(name: str) -> None:
    """InvalidInput for a name no model folder can have (too long, NUL, a path separator)."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("a model name must be valid Unicode text (no lone surrogates)") from None
    if size > MAX_NAME_BYTES:
        raise InvalidInput(f"model name of {size} bytes is too long; a model name has at most "
                           f"{MAX_NAME_BYTES} bytes (it is a folder name)")
    if "\x00" in name or "/" in name or "\\" in name:
        raise InvalidInput(f"model name {name!r} may not contain '/', '\\' or NUL; it is one "
                           "folder name in the repository")


def _last_name(match: re.Match[str]) -> str:
    return match.group(0).rstrip("/").rsplit("/", 1)[-1] or "/"


def public_reason(root: Path, reason: str) -> str:
    """A failure reason as clients may see it: paths inside the repository relative to it,
    any other filesystem path reduced to its last name (the log keeps the full reason)."""
    prefix = str(root).rstrip("/") + "/"
    return _ABSOLUTE_PATH.sub(_last_name, reason.replace(prefix, ""))


def load_error(name: str, failed: list[ServedModel]) -> ServalError:
    """Why a load request failed: LoadFailed (400, as Triton) when a version is broken,
    ModelNotReady (503) when every failure is for want of room now."""
    message = f"failed to load '{name}': " + "; ".join(
        f"version {served.version}: {served.reason}" for served in failed)
    if any(served.broken for served in failed):
        return LoadFailed(message)
    return ModelNotReady(message)
