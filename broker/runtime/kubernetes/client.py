"""Open the official `kubernetes` client: a kubeconfig when named, else the in-cluster config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.runtime.base import BackendRefused


class ClusterUnavailable(BackendRefused):
    reason = "sandbox_cluster_unavailable"


def api_client(kubeconfig: Path | None) -> Any:
    """A configured `ApiClient` (blocking to build: reads files). Raises ClusterUnavailable
    with a one-line message when neither a kubeconfig nor an in-cluster config is usable."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig), client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = "DOCBROKER_KUBECONFIG" if kubeconfig is not None else "the in-cluster config"
        raise ClusterUnavailable(f"the Kubernetes client cannot be configured from {where}") from exc
    # One connection per worker thread that talks to the API at once (to_thread's pool).
    configuration.connection_pool_maxsize = 32
    # No silent retries (each logged by urllib3 with its URL): the lifecycle decides what a
    # failed call means (a start fails, a sandbox is checked again).
    configuration.retries = 0
    return client.ApiClient(configuration)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an ApiException, None for anything else (the API unreachable)."""
    from kubernetes.client.exceptions import ApiException

    return exc.status if isinstance(exc, ApiException) else None
