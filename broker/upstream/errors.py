"""The upstream client's exceptions (the tree is drawn in broker/upstream/__init__.py)."""

from __future__ import annotations


class UpstreamError(Exception):
    """The sandbox could not be reached, or the connection broke."""


class UpstreamTimeout(UpstreamError):
    """The sandbox did not answer in time."""


class UpstreamUnreachable(UpstreamError):
    """No connection could be made: nothing of the request was sent (a gone sandbox)."""


class BodyTooLarge(UpstreamError):
    """The sandbox's answer is longer than the caller will read."""
