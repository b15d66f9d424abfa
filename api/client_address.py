"""The address a request came from, as used by sign-in limits and stored with login attempts.

This is the only place in the API that reads ``X-Forwarded-For`` (uvicorn runs with
``proxy_headers=False``); what to believe of it is ``study.client_address``'s rule, shared with
the dashboard: the header counts only when the socket peer is one of ``settings.trusted_proxies``,
and then the answer is the right-most address that is not itself a trusted proxy.
"""

from __future__ import annotations

from starlette.requests import Request

from study.client_address import resolve


def client_address(request: Request) -> str:
    """The client's IP: the socket peer, or, when the peer is a trusted proxy, the right-most
    untrusted address of ``X-Forwarded-For``. A malformed or overlong header is ignored."""
    return resolve(request.client.host if request.client else None, request.headers.getlist("x-forwarded-for"))
