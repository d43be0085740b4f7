"""The client to a sandbox, and nothing else: connections, buffers, deadlines, errors.

It knows nothing of policy or audit (which headers may cross is the gateway's business,
broker.gateway.forwarding). Exceptions:

    UpstreamError              the sandbox could not be reached, or the connection broke
     ├── UpstreamTimeout       it did not answer in time (a read, or a whole call's deadline)
     ├── UpstreamUnreachable   no connection could be made: nothing of the request was sent
     └── BodyTooLarge          its answer is longer than the caller will read
"""

from broker.upstream.client import Upstream, UpstreamResponse, Upstreams
from broker.upstream.deadlines import Deadlines
from broker.upstream.errors import BodyTooLarge, UpstreamError, UpstreamTimeout, UpstreamUnreachable

__all__ = [
    "BodyTooLarge",
    "Deadlines",
    "Upstream",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "Upstreams",
]
