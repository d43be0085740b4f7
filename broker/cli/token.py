"""`docbroker token`: mint an HS256 token in the dev mode (refused otherwise)."""

from __future__ import annotations

import argparse
import secrets
import sys
import time

from broker.cli.base import Subparsers, UsageError, load_settings

DEMO_SCOPES = "docs:read docs:write reports:approve"


def register(sub: Subparsers) -> None:
    token = sub.add_parser(
        "token",
        help="mint a dev token (HS256 dev mode only)",
        description="Print a signed dev token on stdout (never logged). Only with "
        "DOCBROKER_AUTH_DEV_HS256_SECRET_FILE set; exit 2 otherwise.",
    )
    token.add_argument("--tenant", default="demo")
    token.add_argument("--subject", default="dev-user")
    token.add_argument("--scope", default=DEMO_SCOPES)
    token.add_argument(
        "--ttl", type=int, default=3600, help="seconds (capped by DOCBROKER_AUTH_MAX_LIFETIME)"
    )
    token.set_defaults(func=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    import jwt

    from broker.auth import load_dev_secret

    settings = load_settings()
    secret_file = settings.auth.dev_hs256_secret_file
    if secret_file is None:
        raise UsageError("only in dev mode (DOCBROKER_AUTH_DEV_HS256_SECRET_FILE)")
    now = int(time.time())
    claims = {
        "iss": settings.auth.issuer,
        "aud": settings.auth.audience,
        "sub": args.subject,
        settings.auth.tenant_claim: args.tenant,
        "scope": args.scope,
        "iat": now,
        "exp": now + min(args.ttl, settings.auth.max_lifetime_seconds),
        "jti": secrets.token_hex(8),
    }
    sys.stdout.write(jwt.encode(claims, load_dev_secret(secret_file), algorithm="HS256") + "\n")
    return 0
