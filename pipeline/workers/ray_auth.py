"""Join a Ray cluster the way the cluster requires: with token authentication or without.

Ray 2.59+ clusters started by ``ray start --head`` (and every local ``ray.init()``) use token authentication
and leave the token in ``~/.ray/auth_token``; clusters started otherwise (``RAY_AUTH_MODE=disabled``,
``ray.cluster_utils.Cluster``, older setups) use none. The two do not mix: a driver without the token is
refused by a token cluster, and a driver that sends one to a cluster without authentication is accepted
but its actors are cancelled before they start (the cluster cannot call the driver back), with no cause
in the driver. So the driver asks the cluster: it first connects to the head's GCS without a token; only an
authentication refusal makes it connect again with this machine's token. ``RAY_AUTH_MODE`` set by the user
is left alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from demoforge.pipeline.workers.config import RayAuthenticationError

AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_HINT = ("run `ray get-auth-token` on the head node and write the token to ~/.ray/auth_token on this "
              "machine (or set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file holding it)")


@dataclass(frozen=True)
class ClusterAuth:
    """How this driver authenticates to the cluster: ``mode`` is Ray's ``token`` or ``disabled``."""

    mode: str
    source: str  # where the mode (and the token) came from, for the start-up line

    def describe(self) -> str:
        return f"{'token' if self.mode == 'token' else 'no'} authentication ({self.source})"


def token_source(environ: Any = os.environ) -> str | None:
    """Where Ray would read this machine's token from (its own order of precedence), or None."""
    if environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH={path}" if os.path.isfile(path) else None
    default = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    return "~/.ray/auth_token" if os.path.isfile(default) else None


def settle_auth(ray: Any, address: str) -> ClusterAuth:
    """Choose the authentication mode for joining the cluster at ``address`` (HOST:PORT); blocking.

    Sets ``RAY_AUTH_MODE`` in this process's environment, where ``ray.init`` reads it. Raises
    :class:`RayAuthenticationError` when the cluster wants a token this machine lacks or refuses it."""
    if AUTH_MODE in os.environ:
        return ClusterAuth(os.environ[AUTH_MODE].lower(), f"{AUTH_MODE}={os.environ[AUTH_MODE]} set in the environment")
    if _accepted(ray, address, "disabled"):
        return ClusterAuth("disabled", "the cluster asks for none")
    source = token_source()
    if source is None:
        _set_mode(ray, None)
        raise RayAuthenticationError(
            f"the Ray cluster at {address} uses token authentication and this machine has no token: {TOKEN_HINT}")
    if not _accepted(ray, address, "token"):
        _set_mode(ray, None)
        raise RayAuthenticationError(
            f"the Ray cluster at {address} refused this machine's token (from {source}): it is not the cluster's "
            f"token; {TOKEN_HINT}")
    return ClusterAuth("token", f"token from {source}")


def _accepted(ray: Any, address: str, mode: str) -> bool:
    """Connect to the cluster's GCS in ``mode``: False when it refuses for authentication."""
    _set_mode(ray, mode)
    try:
        ray._raylet.GcsClient(address=address)  # fetches the cluster id: the first call a refused client fails
    except ray.exceptions.AuthenticationError:
        return False
    return True


def _set_mode(ray: Any, mode: str | None) -> None:
    """Ray reads the mode from the environment into its C++ config: refresh both (as Ray's own tests do)."""
    if mode is None:
        os.environ.pop(AUTH_MODE, None)
    else:
        os.environ[AUTH_MODE] = mode
    ray._raylet.Config.initialize("")
    ray._raylet.AuthenticationTokenLoader.instance().reset_cache()
