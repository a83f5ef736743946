"""The suite's HTTP clients: httpx's, with one TLS context for all of them. httpx builds a verifying context for
every client it makes (parsing the CA bundle: 20-40 ms of CPU), and ``httpx.get`` makes a client per call."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def tls() -> ssl.SSLContext:
    """httpx's default verifying context, built once per test process."""
    return httpx.create_ssl_context()


def client(**kwargs: Any) -> httpx.Client:
    """``httpx.Client(**kwargs)`` with the shared TLS context."""
    return httpx.Client(verify=tls(), **kwargs)


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.request``: one request on a client of its own (no cookies kept), with the shared TLS context."""
    return httpx.request(method, url, verify=tls(), **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


def put(url: str, **kwargs: Any) -> httpx.Response:
    return request("PUT", url, **kwargs)
