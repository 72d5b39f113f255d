"""Bearer tokens with scopes: `infer:<model-glob>`, `read`, `admin`. Only hashes are stored.

Tokens are random 256-bit secrets, so a SHA-256 of each is enough at rest; a presented token's
hash is compared with every stored one in constant time.
"""

from __future__ import annotations

import contextvars
import enum
import fnmatch
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from serval.errors import ConfigError, PermissionDenied, Unauthenticated


class Action(enum.Enum):
    """What a request wants to do; each needs a scope."""

    READ = "read"  # metadata, config, readiness, statistics, metrics, repository index
    INFER = "infer"
    ADMIN = "admin"  # repository load / unload
    SHARED_MEMORY = "use shared memory"  # register, unregister, status of shm regions


@dataclass(frozen=True, slots=True)
class Token:
    name: str
    sha256: bytes
    scopes: tuple[str, ...]

    def allows(self, action: Action, model: str) -> bool:
        if "admin" in self.scopes:
            return True
        may_infer = bool(model) and any(
            scope.startswith("infer:") and fnmatch.fnmatchcase(model, scope[6:])
            for scope in self.scopes)
        if action is Action.READ:  # whoever may infer on a model may read its metadata
            return "read" in self.scopes or may_infer
        if action is Action.SHARED_MEMORY:  # regions are server-wide, used to infer
            return any(scope.startswith("infer:") for scope in self.scopes)
        return action is Action.INFER and may_infer

    @property
    def owner_id(self) -> str:
        """Whose shared-memory regions these are: the token itself (names may repeat)."""
        return self.sha256.hex()

    @property
    def sees_all(self) -> bool:
        """An admin reaches every client's shared-memory regions."""
        return "admin" in self.scopes


ANONYMOUS = Token("", b"", ())  # a server without auth: every client is this one
_CALLER = contextvars.ContextVar("serval_caller", default=ANONYMOUS)


def act_as(token: Token) -> None:
    """Name `token` as the caller of what this task runs next (checked already)."""
    _CALLER.set(token)


def current_token() -> Token:
    """The token the running request was authorized with in this task (ANONYMOUS without
    auth): what keeps shared-memory regions to the client that registered them. Every request
    that reaches a region is authorized in the task that serves it; one that somehow was not
    is ANONYMOUS, which reaches no region registered with a token."""
    return _CALLER.get()


class TokenStore:
    """The server's tokens; check() raises Unauthenticated (401) or PermissionDenied (403)."""

    def __init__(self, tokens: list[Token]) -> None:
        self._tokens = tokens

    @classmethod
    def from_file(cls, path: Path) -> TokenStore:
        return cls([_token(entry, path) for entry in _read_entries(path)])

    def check(self, presented: str | None, action: Action, model: str = "") -> Token:
        if not presented:
            raise Unauthenticated("a bearer token is required (Authorization: Bearer <token>)")
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for token in self._tokens:  # every comparison runs: no early exit to time
            if hmac.compare_digest(digest, token.sha256):
                found = token
        if found is None:
            raise Unauthenticated("the bearer token is not valid")
        if not found.allows(action, model):
            target = f" on model '{model}'" if model else ""
            raise PermissionDenied(f"token '{found.name}' may not {action.value}{target}")
        act_as(found)
        return found


def create_token(path: Path, scopes: list[str], name: str) -> str:
    """Append a new token's hash to the file; return the token (shown once, never stored)."""
    for scope in scopes:
        _check_scope(scope, "")
    entries = _read_entries(path) if path.exists() else []
    secret = secrets.token_urlsafe(32)
    entries.append({"name": name, "sha256": hashlib.sha256(secret.encode()).hexdigest(),
                    "scopes": scopes})
    path.write_text(yaml.safe_dump({"tokens": entries}, sort_keys=False))
    path.chmod(0o600)
    return secret


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _read_entries(path: Path) -> list[dict[str, object]]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read tokens: not UTF-8 text (byte "
                          f"{exc.start})") from None
    except (OSError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"{path}: cannot read tokens: {reason}") from None
    entries = doc.get("tokens", []) if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: expected a 'tokens' list")
    return entries


def _token(entry: object, path: Path) -> Token:
    if not isinstance(entry, dict) or not {"name", "sha256", "scopes"} <= set(entry):
        raise ConfigError(f"{path}: each token needs name, sha256 and scopes")
    try:
        digest = bytes.fromhex(str(entry["sha256"]))
    except ValueError:
        raise ConfigError(f"{path}: token '{entry['name']}' has a malformed sha256") from None
    scopes = entry["scopes"]
    where = f"{path}: token '{entry['name']}': "
    if not isinstance(scopes, list):  # a bare "admin" would be the scopes a, d, m, i, n
        raise ConfigError(f"{where}scopes must be a list, such as [admin] or [\"infer:*\"]")
    for scope in scopes:
        _check_scope(scope, where)
    return Token(str(entry["name"]), digest, tuple(scopes))


def _check_scope(scope: object, where: str) -> None:
    """ConfigError for a scope no check knows: it would grant nothing, silently."""
    if not isinstance(scope, str) or (scope not in ("read", "admin")
                                      and not scope.startswith("infer:")):
        raise ConfigError(f"{where}unknown scope '{scope}'; use read, admin or "
                          "infer:<model-glob>")
