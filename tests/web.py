"""The suite's HTTP clients: httpx's, with the service's one TLS context (steps/tls.py). httpx builds a verifying
context for every client it makes (parsing the CA bundle: 20-40 ms of CPU), and ``httpx.get`` makes one per call."""

from __future__ import annotations

from typing import Any

import httpx

from steps.tls import client_context as tls


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
