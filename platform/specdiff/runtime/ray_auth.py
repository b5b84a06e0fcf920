"""Ray's token authentication, for the platform's own local Ray and its Job Submission client. No Ray import here.

What Ray 2.60 does (read from its source: ``ray/_private/authentication/authentication_token_setup.py``,
``ray/_private/worker.py``, ``ray/scripts/scripts.py``, ``ray/dashboard/modules/dashboard_sdk.py``):

- a ``ray.init()`` that starts a new local Ray turns token auth on when ``RAY_AUTH_MODE`` is unset, and when no
  token exists it writes a new one to ``~/.ray/auth_token``;
- ``ray start --head`` turns token auth on when ``RAY_AUTH_MODE`` is unset and a token exists (``RAY_AUTH_TOKEN``,
  the file ``RAY_AUTH_TOKEN_PATH`` names, or ``~/.ray/auth_token``);
- the HTTP clients (``JobSubmissionClient``, ``ray job submit``) send the token only when their own process has
  ``RAY_AUTH_MODE=token``.

So on a fresh machine one local distillation run (``jobs/generate.py``'s first-run build) left a token behind, the
next ``ray start --head`` enabled auth, and the re-alignment client, a new process without ``RAY_AUTH_MODE``, was
refused ("Missing authentication token"). Two pieces here mend it:

- ``use_private_token()``, before the platform starts a private local Ray: where no mode is set and no token exists,
  the process gets a fresh token in ``RAY_AUTH_TOKEN`` (its Ray and workers inherit it), so that Ray keeps token
  auth and nothing is written to ``~/.ray``: a later ``ray start`` starts as it would have without the platform;
- ``auth_headers()``, for the platform's HTTP clients: the token Ray would read, as an ``Authorization`` header,
  unless ``RAY_AUTH_MODE=disabled``. A cluster without token auth ignores the header.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
HINT = ("run it where ~/.ray/auth_token holds the cluster's token (`ray get-auth-token` on the head prints it) or "
        "set RAY_AUTH_TOKEN; Ray's own CLI (`ray job submit`) also needs RAY_AUTH_MODE=token")


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def find_token() -> tuple[str, str] | None:
    """(token, where it came from) from the places Ray reads, in Ray's order, or None."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token, TOKEN_ENV
    for path in [os.environ.get(TOKEN_PATH_ENV), default_token_path()]:
        if path:
            try:
                token = Path(path).expanduser().read_text().strip()
            except OSError:
                continue
            if token:
                return token, str(path)
    return None


def use_private_token() -> bool:
    """Before a private local ``ray.init()``: keep Ray's token auth without writing ``~/.ray/auth_token``. Where
    ``RAY_AUTH_MODE`` is set or a token exists, nothing changes (Ray uses them). True if a token was made."""
    if os.environ.get(MODE_ENV) is not None or find_token() is not None:
        return False
    os.environ[TOKEN_ENV] = secrets.token_hex(32)
    return True


def auth_headers() -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` for a Ray HTTP client (dashboard, Job Submission), or {} where
    ``RAY_AUTH_MODE=disabled`` or no token exists."""
    if os.environ.get(MODE_ENV, "").lower() == "disabled":
        return {}
    found = find_token()
    return {"Authorization": f"Bearer {found[0]}"} if found else {}


def refused_message(address: str, err: Exception) -> str:
    """One line for a client the cluster refused (Ray's AuthenticationError)."""
    found = find_token()
    if os.environ.get(MODE_ENV, "").lower() == "disabled":
        sent = f"this process has {MODE_ENV}=disabled"
    else:
        sent = f"the token from {found[1]} was refused" if found else "this process has no token"
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"the Ray cluster at {address} has token authentication on and {sent} ({first}): {HINT}"
