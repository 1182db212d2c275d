"""Who may do what: bearer tokens, the login cookie, and the scope of each token.

A token names one person. It is presented as ``Authorization: Bearer <token>``
(the API), or once on the login page, which then sets a cookie: the identity
and an expiry, signed with a key derived from that person's token, so the
cookie never holds the token, and replacing a token in the tokens file ends
every session it opened. The cookie is ``HttpOnly``, ``Secure`` (browsers keep
it over plain HTTP only on localhost; elsewhere serve HTTPS) and
``SameSite=Strict``; forms carry a CSRF field derived from the session too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from statekeep._check import check_id
from statekeep.errors import ConfigError, InvalidInputError
from statekeep.workflow import Approval, Run
from statekeep.workflow.search import run_owner

MIN_TOKEN_LENGTH = 16
#: The largest request body the webhook reads, unless ``create_app(max_body=...)`` says otherwise.
DEFAULT_MAX_BODY = 64 * 1024
#: How long a login lasts, in seconds.
SESSION_SECONDS = 12 * 3600
COOKIE = "statekeep_session"
_TOKEN = re.compile(rf"[!-~]{{{MIN_TOKEN_LENGTH},}}")
_SCOPES = ("gates", "owners")


@dataclass(frozen=True)
class Grant:
    """What one bearer token allows: who it names, and the gates and owners it is limited to.

    ``None`` means no limit; a set limits the token to approvals whose action is
    one of ``gates`` and (both, when both are set) whose run's owner is one of ``owners``.
    In the console, ``owners`` also limits the runs and the memories it sees, and
    ``gates`` the runs (to those with an approval of one of them).
    """

    identity: str
    gates: frozenset[str] | None = None
    owners: frozenset[str] | None = None

    @property
    def scoped(self) -> bool:
        return self.gates is not None or self.owners is not None

    def allows(self, action: str, owner: str | None) -> bool:
        """True if an approval of ``action``, in a run of ``owner`` (None: no owner), is in scope."""
        if self.gates is not None and action not in self.gates:
            return False
        return self.owners is None or (owner is not None and owner in self.owners)

    def allows_owner(self, owner: str | None) -> bool:
        """True if the runs and memories of ``owner`` are in scope (gates aside)."""
        return self.owners is None or (owner is not None and owner in self.owners)

    def describe(self) -> str:
        """The scope in words."""
        if not self.scoped:
            return "every run, approval and owner"
        parts = []
        if self.gates is not None:
            parts.append("gates " + ", ".join(sorted(self.gates)))
        if self.owners is not None:
            parts.append("owners " + ", ".join(sorted(self.owners)))
        return "; ".join(parts)


def check_tokens(tokens: Mapping[str, Any]) -> list[tuple[str, Grant]]:
    """(token, grant) pairs: identities storable, tokens long, printable and distinct, scopes sound.

    Raises:
        ConfigError: naming what is wrong.
    """
    if not isinstance(tokens, Mapping) or not tokens:
        raise ConfigError("tokens", "{}", "name at least one person and their token")
    checked: list[tuple[str, Grant]] = []
    for identity, entry in tokens.items():
        try:
            if not isinstance(identity, str) or not identity.strip():
                raise InvalidInputError("must be a non-empty string")
            check_id(identity, "identity")
        except InvalidInputError as exc:
            raise ConfigError("tokens", repr(identity), f"an identity {exc}") from None
        token, scope = _entry(identity, entry)
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise ConfigError(
                "tokens",
                identity,
                f"the token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters, no spaces",
            )
        checked.append((token, Grant(identity, **scope)))
    if len({token for token, _ in checked}) != len(checked):
        raise ConfigError("tokens", "(tokens)", "two identities share a token; each needs its own")
    return checked


def _entry(identity: str, entry: object) -> tuple[object, dict[str, frozenset[str]]]:
    """A token entry: the token itself, or ``{"token": ..., "gates": [...], "owners": [...]}``."""
    if not isinstance(entry, Mapping):
        return entry, {}
    if "token" not in entry:
        raise ConfigError(
            "tokens", identity, 'give a token, or {"token": ..., "gates": [...], "owners": [...]}'
        )
    unknown = sorted(str(k) for k in entry if k not in ("token", *_SCOPES))
    if unknown:
        raise ConfigError(
            "tokens", identity, f"unknown key {unknown[0]!r}; a token entry has token, {_SCOPES}"
        )
    scope: dict[str, frozenset[str]] = {}
    for name in _SCOPES:
        if name not in entry:
            continue
        values = entry[name]
        if not isinstance(values, list | tuple) or not values:
            raise ConfigError(
                "tokens", identity, f"{name} must be a non-empty list of names (leave it out for no limit)"
            )
        try:
            scope[name] = frozenset(check_id(v, name) for v in values)
        except InvalidInputError as exc:
            raise ConfigError("tokens", identity, f"{name}: every entry {exc}") from None
    return entry["token"], scope


def check_max_body(max_body: object) -> int:
    """A body limit in bytes, at least 1.

    Raises:
        ConfigError: anything else.
    """
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ConfigError("max_body", repr(max_body), "must be a whole number of bytes, at least 1")
    return max_body


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("latin-1", "replace")).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Access:
    """The tokens of one app: who a request is, and what that person may see and decide."""

    def __init__(self, tokens: Mapping[str, Any]) -> None:
        checked = check_tokens(tokens)
        self._by_digest = [(_digest(token), grant) for token, grant in checked]
        self._keys = {grant.identity: hashlib.sha256(b"statekeep-session" + _digest(token)).digest()
                      for token, grant in checked}  # fmt: skip
        self.grants = [grant for _, grant in checked]

    # --- who is asking ----------------------------------------------------------------------

    def by_token(self, token: str) -> Grant | None:
        """The grant of a token, or None; every known digest is compared (timing says nothing)."""
        digest = _digest(token.strip())
        found = None
        for known, grant in self._by_digest:
            if hmac.compare_digest(known, digest):
                found = grant
        return found

    def by_header(self, authorization: str | None) -> Grant | None:
        """The grant of ``Authorization: Bearer <token>``, or None."""
        scheme, _, presented = (authorization or "").partition(" ")
        return self.by_token(presented if scheme.lower() == "bearer" else "")

    def session(self, grant: Grant, now: float | None = None) -> str:
        """A signed session cookie value for ``grant``: identity and expiry, never the token."""
        expires = int((now or time.time()) + SESSION_SECONDS)
        body = f"{_b64(grant.identity.encode())}.{expires}"
        return f"{body}.{self._sign(grant.identity, body)}"

    def by_cookie(self, value: str | None, now: float | None = None) -> Grant | None:
        """The grant of a session cookie that is well signed and not expired, or None."""
        try:
            ident, expires, signature = (value or "").split(".")
            identity = _unb64(ident).decode()
            if int(expires) < (now or time.time()):
                return None
        except (ValueError, UnicodeDecodeError):
            return None
        if identity not in self._keys:
            return None
        if not hmac.compare_digest(signature, self._sign(identity, f"{ident}.{expires}")):
            return None
        return next(g for g in self.grants if g.identity == identity)

    def csrf(self, grant: Grant) -> str:
        """The value a form of this person carries, so another site cannot post it."""
        return self._sign(grant.identity, "csrf")

    def check_csrf(self, grant: Grant, value: str | None) -> bool:
        """True if ``value`` is this person's CSRF field."""
        return hmac.compare_digest(value or "", self.csrf(grant))

    def _sign(self, identity: str, body: str) -> str:
        return _b64(hmac.new(self._keys[identity], body.encode(), hashlib.sha256).digest())

    # --- what they may see --------------------------------------------------------------------

    def deciders(self, approval: Approval, owner: str | None) -> list[str]:
        """Every person whose token may decide ``approval``."""
        return sorted(g.identity for g in self.grants if g.allows(approval.action, owner))


def owners_lookup(grant: Grant, get_run: Callable[[str], Run]) -> Callable[[str], str | None]:
    """Each run's owner, read once per request (only when the grant is limited to owners)."""
    known: dict[str, str | None] = {}

    def owner(run_id: str) -> str | None:
        if grant.owners is None:
            return None
        if run_id not in known:
            known[run_id] = run_owner(get_run(run_id))
        return known[run_id]

    return owner


__all__ = [
    "COOKIE",
    "DEFAULT_MAX_BODY",
    "MIN_TOKEN_LENGTH",
    "SESSION_SECONDS",
    "Access",
    "Grant",
    "check_max_body",
    "check_tokens",
    "owners_lookup",
]
