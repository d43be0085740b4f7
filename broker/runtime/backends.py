"""The sandbox backend the settings name (local process, Docker or Kubernetes), connected:
`serve` and the `sandbox` commands make theirs here."""

from __future__ import annotations

from broker.master_key import load_master_key
from broker.runtime.base import SandboxBackend
from broker.runtime.host_replicas import Replicas
from broker.settings import RuntimeKind, Settings


async def make_backend(settings: Settings) -> SandboxBackend:
    """The sandbox backend the settings name; Docker is connected (and checked) here."""
    replicas = Replicas(settings.replicas_dir, settings.replica_id)
    if settings.runtime.kind is RuntimeKind.LOCAL:
        from broker.runtime.local import LocalProcessBackend

        command = settings.runtime.local_command
        return LocalProcessBackend(command, run_dir=settings.run_dir, replicas=replicas)
    if settings.runtime.kind is RuntimeKind.KUBERNETES:
        from broker.runtime.kubernetes import KubernetesBackend

        return await KubernetesBackend.connect(
            settings.runtime.kubernetes,
            load_master_key(settings.master_key_file),
            instance=settings.runtime.instance,
            replica_id=settings.replica_id,
            start_timeout=settings.runtime.start_timeout_seconds,
        )
    from broker.runtime.docker import DockerBackend
    from broker.runtime.imagetrust import ImageTrust

    return await DockerBackend.connect(
        settings.runtime.docker,
        instance=settings.runtime.instance,
        pool_dir=settings.pool_dir,
        replicas=replicas,
        # DESIGN §13: with release keys, no sandbox starts from an image they do not vouch for.
        trust=ImageTrust.from_settings(settings.supply),
        pool_idle_seconds=settings.runtime.idle_timeout_seconds,
    )
