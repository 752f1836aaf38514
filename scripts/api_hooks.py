"""schemathesis hooks for scripts/test-api: credentials for a live origin.

The origin refuses nearly everything without a valid credential, so a run
without them would only ever see 401s. This signs, per generated case and
with the run's own dev keys (from the environment scripts/test-api sets):

- `Authorization: Bearer <admit>` for `POST /api/sales/{sale}/reservations`
  (an admit token for that sale), and a `user` token for the reservation
  routes that take "admit or user";
- `Payment-Signature: t=…,v1=…` over the exact bytes of a webhook's body.

They are schemathesis *auth providers* (not a before_call hook), so its
`ignored_auth` check can take them off again and see the origin refuse.
Tokens are the v1 format of DESIGN.md, minted here as a shop or the edge
would: base64url(JSON claims), HMAC-SHA256 with the first key of the ring.
"""

import base64
import hashlib
import hmac
import json
import os
import secrets
import time

import schemathesis

ACCOUNT = "schemathesis"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _first_key(var: str) -> tuple[str, bytes]:
    kid, key = os.environ[var].split(",")[0].split(":", 1)
    return kid, base64.b64decode(key)


def _token(var: str, typ: str, sale: str | None) -> str:
    kid, key = _first_key(var)
    now = int(time.time())
    claims = {"typ": typ, "sub": ACCOUNT}
    if sale is not None:
        claims["sale"] = sale
    claims.update({"iat": now, "exp": now + 600, "jti": _b64(secrets.token_bytes(16))})
    head = f"v1.{kid}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
    sig = hmac.new(key, head.encode(), hashlib.sha256).digest()
    return f"{head}.{_b64(sig)}"


@schemathesis.auth(refresh_interval=None).apply_to(path="/api/sales/{sale}/reservations")
class AdmitToken:
    """An admit token for the case's own sale (a fresh one each case)."""

    def get(self, case, ctx):
        sale = (case.path_parameters or {}).get("sale", "")
        return _token("ADMISSION_TOKEN_KEYS", "admit", str(sale))

    def set(self, case, data, ctx):
        case.headers = case.headers or {}
        case.headers["Authorization"] = f"Bearer {data}"


@schemathesis.auth(refresh_interval=None).apply_to(path_regex="^/api/reservations/")
class UserToken:
    """A user token: the reservation routes take "admit or user"."""

    def get(self, case, ctx):
        return _token("USER_TOKEN_KEYS", "user", None)

    def set(self, case, data, ctx):
        case.headers = case.headers or {}
        case.headers["Authorization"] = f"Bearer {data}"


@schemathesis.auth(refresh_interval=None).apply_to(path="/webhooks/payments")
class WebhookSignature:
    """The provider's signature over the body bytes that will be sent."""

    def get(self, case, ctx):
        return os.environ["PAYMENT_WEBHOOK_SECRET"].split(",")[0]

    def set(self, case, data, ctx):
        body = case.body
        if isinstance(body, (bytes, bytearray)):
            raw = bytes(body)
        elif body is None or type(body).__name__ == "NotSet":
            raw = b""
        else:
            # Sent as these bytes exactly (schemathesis passes bytes through),
            # so the signature is over what the origin reads.
            raw = json.dumps(body).encode()
            case.body = raw
        t = int(time.time())
        mac = hmac.new(data.encode(), f"{t}.".encode() + raw, hashlib.sha256).hexdigest()
        case.headers = case.headers or {}
        case.headers["Payment-Signature"] = f"t={t},v1={mac}"


@schemathesis.auth(refresh_interval=None).apply_to(path_regex="^/admin/api/")
class AdminKey:
    """The admin API's write key (scripts/test-api's ADMIN_KEYS)."""

    def get(self, case, ctx):
        return os.environ["ADMIN_WRITE_SECRET"]

    def set(self, case, data, ctx):
        case.headers = case.headers or {}
        case.headers["Authorization"] = f"Bearer {data}"
