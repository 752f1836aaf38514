#!/usr/bin/env python3
"""Generates token/tests/jwt_vectors.json: JWT `user` tokens minted by PyJWT,
a JWT library that is not this product's code, so the vectors check our
verifier against what a shop's library really sends.

    python3 -m venv /tmp/jwt-venv && /tmp/jwt-venv/bin/pip install PyJWT==2.15.1
    /tmp/jwt-venv/bin/python token/tests/make_jwt_vectors.py > token/tests/jwt_vectors.json

Every token below is PyJWT's output; the "tampered" ones splice segments of
two PyJWT tokens (no HMAC is computed here), which is what an attacker can
do without the key. Deterministic: fixed keys and times, no random claims.
"""

import base64
import json
import sys

import jwt

K_NEW = bytes(range(0, 32))  # kid k2025b, signs (same keys as vectors.json)
K_OLD = bytes(range(100, 132))  # kid k2025a, still verifies
K_STRANGER = bytes([0x42] * 32)  # a key the verifier does not hold
KEYS = "k2025b:%s,k2025a:%s" % (
    base64.b64encode(K_NEW).decode(),
    base64.b64encode(K_OLD).decode(),
)
NOW = 1_767_000_000


def mint(claims, key=K_NEW, kid="k2025b", alg="HS256", extra_headers=None):
    headers = {} if kid is None else {"kid": kid}
    headers.update(extra_headers or {})
    return jwt.encode(claims, key, algorithm=alg, headers=headers)


def base(**over):
    c = {"sub": "acct-42", "iat": NOW, "exp": NOW + 3600}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def splice(token_a, token_b, part):
    """token_a with segment `part` taken from token_b."""
    a, b = token_a.split("."), token_b.split(".")
    a[part] = b[part]
    return ".".join(a)


def b64(obj):
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


good = mint(base())
valid = [
    {"name": "minimal (kid, sub, iat, exp)", "token": good, "now": NOW,
     "sub": "acct-42", "iat": NOW, "exp": NOW + 3600},
    {"name": "older key of the ring", "token": mint(base(), key=K_OLD, kid="k2025a"),
     "now": NOW, "sub": "acct-42", "iat": NOW, "exp": NOW + 3600},
    {"name": "nbf, jti and a shop's own claims",
     "token": mint(base(sub="alice@example.com", nbf=NOW, jti="shop-7f3a",
                        iss="https://shop.example", aud="flashsale", roles=["buyer"])),
     "now": NOW + 10, "sub": "alice@example.com", "iat": NOW, "exp": NOW + 3600,
     "jti": "shop-7f3a"},
    {"name": "no typ header", "token": mint(base(), extra_headers={"typ": None}),
     "now": NOW, "sub": "acct-42", "iat": NOW, "exp": NOW + 3600},
    {"name": "fractional NumericDate", "token": mint(base(iat=NOW + 0.25, exp=NOW + 60.75)),
     "now": NOW, "sub": "acct-42", "iat": NOW, "exp": NOW + 60},
]

refused = [
    {"name": "alg none", "token": mint(base(), key=None, alg="none"), "error": "token_alg_refused"},
    {"name": "alg HS384", "token": mint(base(), alg="HS384"), "error": "token_alg_refused"},
    {"name": "alg HS512", "token": mint(base(), alg="HS512"), "error": "token_alg_refused"},
    {"name": "unknown kid", "token": mint(base(), key=K_STRANGER, kid="k-shop-other"),
     "error": "token_unknown_kid"},
    {"name": "no kid header", "token": mint(base(), kid=None), "error": "token_unknown_kid"},
    {"name": "known kid, wrong key", "token": mint(base(), key=K_STRANGER),
     "error": "token_bad_signature"},
    {"name": "tampered payload (sub swapped)",
     "token": splice(good, mint(base(sub="acct-43")), 1), "error": "token_bad_signature"},
    {"name": "tampered header (kid swapped)",
     "token": splice(good, mint(base(), key=K_OLD, kid="k2025a"), 0),
     "error": "token_bad_signature"},
    {"name": "signature of another token", "token": splice(good, mint(base(exp=NOW + 7200)), 2),
     "error": "token_bad_signature"},
    {"name": "expired", "token": mint(base(exp=NOW + 60)), "now": NOW + 66,
     "error": "token_expired"},
    {"name": "issued in the future", "token": mint(base()), "now": NOW - 6,
     "error": "token_not_yet_valid"},
    {"name": "not before in the future", "token": mint(base(nbf=NOW + 60)), "now": NOW + 54,
     "error": "token_not_yet_valid"},
    {"name": "sub missing", "token": mint(base(sub=None)), "error": "token_malformed"},
    {"name": "sub not a string", "token": mint(base(sub=42)), "error": "token_malformed"},
    {"name": "sub empty", "token": mint(base(sub="")), "error": "token_malformed"},
    {"name": "sub with U+0000", "token": mint(base(sub="acct\u000042")), "error": "token_bad_subject"},
    {"name": "sub with a line feed", "token": mint(base(sub="acct\n42")), "error": "token_bad_subject"},
    {"name": "sub of 257 bytes", "token": mint(base(sub="a" * 257)), "error": "token_bad_subject"},
    {"name": "exp missing", "token": mint(base(exp=None)), "error": "token_malformed"},
    {"name": "iat missing", "token": mint(base(iat=None)), "error": "token_malformed"},
    {"name": "exp not a number", "token": mint(base(exp="tomorrow")), "error": "token_malformed"},
    {"name": "exp negative", "token": mint(base(exp=-1)), "error": "token_malformed"},
    {"name": "crit header (extension we do not know)",
     "token": mint(base(), extra_headers={"crit": ["exp-x"], "exp-x": 1}),
     "error": "token_malformed"},
    {"name": "header not JSON", "token": "bm90IGpzb24." + good.split(".", 1)[1],
     "error": "token_malformed"},
    {"name": "header alg not a string",
     "token": b64({"alg": 256, "kid": "k2025b"}) + "." + good.split(".", 1)[1],
     "error": "token_malformed"},
    {"name": "two segments", "token": good.rsplit(".", 1)[0], "error": "token_malformed"},
    {"name": "four segments", "token": good + ".x", "error": "token_malformed"},
    {"name": "padded signature", "token": good + "=", "error": "token_malformed"},
]
for r in refused:
    r.setdefault("now", NOW)

accepted_at_edges = [
    {"name": "expired within skew", "token": mint(base(exp=NOW + 60)), "now": NOW + 65},
    {"name": "issued within skew in the future", "token": good, "now": NOW - 5},
    {"name": "not before within skew", "token": mint(base(nbf=NOW + 60)), "now": NOW + 55},
]

json.dump(
    {
        "comment": "JWT (HS256) user-token vectors minted by PyJWT %s, not by this product's code. "
        "Checked by the host build (cargo test -p token) and the Wasm build (scripts/test-wasm). "
        "Regenerate: see token/tests/make_jwt_vectors.py." % jwt.__version__,
        "generator": "PyJWT %s" % jwt.__version__,
        "keys": KEYS,
        "valid": valid,
        "refused": refused,
        "accepted_at_edges": accepted_at_edges,
    },
    sys.stdout,
    indent=2,
    sort_keys=True,
)
sys.stdout.write("\n")
