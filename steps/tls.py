"""The one verifying TLS context the service's HTTP clients share: building one parses the CA bundle (20-40 ms of
CPU), so a client made per call must not build its own."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def client_context() -> ssl.SSLContext:
    """httpx's default verifying context (the same trust store and settings), built once per process."""
    return httpx.create_ssl_context()
