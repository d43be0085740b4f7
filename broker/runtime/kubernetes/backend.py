# Over 450 lines: one class, the Kubernetes backend: the tenant Pods' lifecycle through the API.
"""Kubernetes backend: one Pod per tenant in the tenants namespace, MCP over the pod network.

    backend = await KubernetesBackend.connect(settings.runtime.kubernetes, master_key, ...)
    runtime = Runtime(backend, tenants.provision, ...)

The API server is the source of truth (DESIGN §9). The tenant's Pod has a fixed name, so of
replicas racing to start one the API lets one create it and the others get 409 and adopt
it; a restarted broker finds the Pods by labels (`discover`). A Pod is one sandbox instance by
its uid: `alive()` is false for a Pod that failed (`restartPolicy: Never`), restarted a
container, is being deleted or was replaced by another of the same name, and `delete()`
deletes only that uid, never a successor another replica started.

The tenant's Secret (its approval secret, sandbox key, keeper key) is created, or patched
when it exists, right before its Pod, and never read: the RBAC has no get/list/watch on
secrets, and the create/patch answers are drained unparsed.

Why worker threads and the official client (not kubernetes_asyncio, a separate generated
fork): the issue names the official client, and its calls are short but for the readiness
watch. They run on a pool of this backend's own, so twenty Pods starting at once wait on
twenty watches without starving the event loop's default executor (sized by CPU count).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from broker.runtime.base import ImageUntrusted, SandboxBackend, SandboxStartError, SourcesBusy, SpecRefused
from broker.runtime.host_replicas import Replicas, SharedUse
from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.client import ClusterUnavailable, api_client, status_of
from broker.runtime.kubernetes.lastuse import PodAnnotationUse, stamp
from broker.runtime.kubernetes.podspec import tenant_pod, tenant_secret_object
from broker.runtime.podsecurity import check_pod_spec
from broker.settings import KubernetesSettings
from broker.threads import in_pool_to_the_end
from broker.types import Endpoint, SandboxInfo, SandboxSpec, SandboxState

log = logging.getLogger("docbroker.runtime.kubernetes")
_T = TypeVar("_T")

WORKERS = 64
API_TIMEOUT = 10.0  # seconds for one short API call (connect + read)
GONE_WAIT_SECONDS = 15.0  # for a terminating Pod of the tenant's name to go before a new one


class KubeReplicas(Replicas):
    """Replicas on a cluster: the broker's RBAC sees no broker Pods, so no replica can tell
    whether another is alive. Each takes every other one for alive: start-up and shutdown
    never remove a Pod another replica may be using, and a Pod is removed by the idle reaper
    of a replica that holds it, once no replica has used it for the idle timeout (the Pod's
    last-use annotation, `lastuse.py`), or when it fails. (The Docker runtime's lock files
    have no shared folder here.)"""

    def __init__(self, replica_id: str) -> None:
        super().__init__(None, replica_id)

    def alive(self, replica: str) -> bool:
        return True

    def peers_alive(self) -> bool:
        return True


class KubernetesBackend(SandboxBackend):
    name = "kubernetes"

    def __init__(
        self,
        settings: KubernetesSettings,
        api: Any,
        master_key: bytes,
        *,
        instance: str,
        replica_id: str,
        start_timeout: float,
    ) -> None:
        """Use `connect()`: it builds the client (blocking) and checks the API answers."""
        from kubernetes import client

        self._settings = settings
        self._api = api
        self._core: Any = client.CoreV1Api(api)  # bodies are dicts (podspec.py), not models
        self._master_key = master_key
        self._instance = instance
        self._start_timeout = start_timeout
        self.replicas = KubeReplicas(replica_id)
        self._pool = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="kube")

    @classmethod
    async def connect(
        cls,
        settings: KubernetesSettings,
        master_key: bytes,
        *,
        instance: str = "default",
        replica_id: str = "local",
        start_timeout: float = 20.0,
    ) -> KubernetesBackend:
        """Raises ClusterUnavailable (no config, the API does not answer, or refuses to list
        Pods in the tenants namespace) with a one-line message."""
        api = await asyncio.to_thread(api_client, settings.kubeconfig)
        backend = cls(
            settings, api, master_key, instance=instance, replica_id=replica_id, start_timeout=start_timeout
        )
        try:
            await backend._call(backend._list)
        except Exception as exc:
            await backend.close()
            status = status_of(exc)
            if status in (401, 403):
                raise ClusterUnavailable(
                    f"the Kubernetes API refuses to list pods in {settings.namespace} (HTTP {status}): "
                    "check the broker's RBAC with `docbroker doctor`"
                ) from exc
            raise ClusterUnavailable("the Kubernetes API does not answer (run `docbroker doctor`)") from exc
        return backend

    # -- SandboxBackend --------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        return await self._call(self._create, spec.tenant)

    async def alive(self, info: SandboxInfo) -> bool:
        return await self._call(self._alive, info)

    async def delete(self, info: SandboxInfo) -> None:
        await self._call(
            self._delete, str(info.details.get("pod") or names.object_name(info.tenant)), info.backend_id
        )

    async def discover(self) -> list[SandboxInfo]:
        return [self._info(pod, adopted=False) for pod in await self._call(self._list)]

    async def remove_tenant(self, tenant: str, run_dir: str) -> int:
        pods = await self._call(self._list, tenant)
        for pod in pods:
            await self._call(self._delete, pod.metadata.name, pod.metadata.uid)
        return len(pods)

    def shared_use(self, every: float) -> SharedUse:
        return PodAnnotationUse(
            every,
            patch=lambda tenant, when: self._call(self._patch_last_used, tenant, when),
            read=lambda tenant: self._call(self._read, names.object_name(tenant)),
            annotation=names.LAST_USED,
        )

    def describe(self) -> dict[str, Any]:
        s = self._settings
        return {
            "backend": self.name,
            "mode": self.mode().value,
            "namespace": s.namespace,
            "seccomp": s.seccomp,
            # RuntimeDefault allows chmod/unlink/rename in the server container: a fallback.
            "seccomp_fallback": not s.seccomp.startswith("localhost/"),
            "runtime_class": s.runtime_class,
            "limits_enforced": True,  # requests = limits on every container, set by the kubelet
            "image": s.server_image,
            # The server image's digest (settings require `name@sha256:…` on this runtime).
            "image_digest": s.server_image.rpartition("@")[2] if "@sha256:" in s.server_image else "",
            # Signatures on a cluster are admission's to check (docs/supply-chain-kubernetes.md):
            # the broker pins the digest, the node's runtime pulls exactly that content.
            "image_trust": {
                "state": "off",
                "reason": "the broker pins the digest; signatures are for the cluster's admission to verify",
            },
        }

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._api.close)

    # -- the event loop's side ---------------------------------------------------------------------

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a blocking client call on this backend's pool; a cancelled caller still waits
        for it: a Pod created after the caller's clean-up would be left running."""
        return await in_pool_to_the_end(self._pool, fn, *args)

    # -- blocking helpers (worker threads) ---------------------------------------------------------

    def _create(self, tenant: str) -> SandboxInfo:
        """The tenant's Pod, Ready: created, or another replica's adopted; a failed or
        terminating one of that name is removed first."""
        started = time.monotonic()
        deadline = started + self._start_timeout
        body = tenant_pod(self._settings, tenant, instance=self._instance, replica=self.replicas.me)
        # Pod Security "restricted" and ours, on the very object sent: admission may be missing
        # or weaker on the cluster (1.20 has none; a namespace may lack its labels). Before the
        # Secret too: a refused start leaves nothing behind.
        violations = check_pod_spec(body["spec"], metadata=body["metadata"], tenant=True)
        if violations:
            rules = sorted({v.rule for v in violations})
            if rules == ["image"]:  # settings refuse a tag at load; this is the last line of defence
                raise ImageUntrusted("the tenant's pod would name its image by a tag, not by digest")
            raise SpecRefused(f"the tenant's pod spec fails the Pod Security check ({', '.join(rules)})")
        if self._settings.sources_access_mode == "ReadWriteOnce" and self._pushing(tenant):
            raise SourcesBusy("the tenant's sources are being replaced (a push); retry when it ends")
        self._put_secret(tenant)
        while time.monotonic() < deadline:
            adopted = False
            # The start is a use (the other replicas' reapers read it): stamped at each attempt.
            body["metadata"]["annotations"] = {names.LAST_USED: stamp(time.time())}
            try:
                pod = self._core.create_namespaced_pod(
                    self._settings.namespace, body, _request_timeout=API_TIMEOUT
                )
            except Exception as exc:
                if status_of(exc) != 409:
                    raise SandboxStartError(_api_refusal("create the tenant's pod", exc)) from exc
                pod = self._read(names.object_name(tenant))
                if pod is None:
                    continue  # gone between the conflict and the read
                if _finished(pod) or pod.metadata.deletion_timestamp is not None:
                    self._delete(pod.metadata.name, pod.metadata.uid)
                    self._wait_gone(
                        pod.metadata.name,
                        pod.metadata.uid,
                        min(deadline, time.monotonic() + GONE_WAIT_SECONDS),
                    )
                    continue
                adopted = True
            try:
                ready = self._wait_ready(pod, deadline)
            except SandboxStartError:
                if not adopted:  # ours, and it will not serve: no Pod is left behind
                    self._delete(pod.metadata.name, pod.metadata.uid)
                raise
            info = self._info(ready, adopted=adopted, serving=True)
            info.started_at = started
            return info
        raise SandboxStartError("the tenant's pod kept being replaced while starting")

    def _put_secret(self, tenant: str) -> None:
        """Create the tenant's Secret, or patch it to the keys of this master key (a rotated
        master key rotates them). The answers are drained, never parsed: nothing read back."""
        body = tenant_secret_object(
            self._master_key, tenant, namespace=self._settings.namespace, instance=self._instance
        )
        ns = self._settings.namespace
        try:
            _drain(
                self._core.create_namespaced_secret(
                    ns, body, _preload_content=False, _request_timeout=API_TIMEOUT
                )
            )
        except Exception as exc:
            if status_of(exc) != 409:
                raise SandboxStartError(_api_refusal("create the tenant's secret", exc)) from exc
            patch = {"metadata": {"labels": body["metadata"]["labels"]}, "data": body["data"]}
            try:
                _drain(
                    self._core.patch_namespaced_secret(
                        names.object_name(tenant),
                        ns,
                        patch,
                        _preload_content=False,
                        _request_timeout=API_TIMEOUT,
                    )
                )
            except Exception as exc2:
                raise SandboxStartError(_api_refusal("patch the tenant's secret", exc2)) from exc2

    def _wait_ready(self, pod: Any, deadline: float) -> Any:
        """The Pod once both its servers accept connections; SandboxStartError when it
        fails, goes, or the start timeout passes. The broker connects itself (the readiness
        probe's check) as soon as the Pod has an address: the kubelet reports containers
        running only at its next relist (once a second), and its Ready condition comes from a
        probe once a second; either wait cost up to a second of every first call (measured on
        the lab: 1.8 s from the address to "running", the ports open well before)."""
        pod = self._wait_addressed(pod, deadline)
        ip = pod.status.pod_ip
        next_look = time.monotonic() + 0.5
        while not (_accepts(ip, names.MCP_PORT) and _accepts(ip, names.KEEPER_PORT)):
            now = time.monotonic()
            if now >= deadline:
                raise SandboxStartError("the tenant's pod did not become ready in time")
            if now >= next_look:  # a container that died meanwhile: give up at once
                fresh = self._read(pod.metadata.name)
                if fresh is None or fresh.metadata.uid != pod.metadata.uid:
                    raise SandboxStartError("the tenant's pod was deleted while starting")
                _check_starting(fresh)
                next_look = now + 0.5
            time.sleep(0.01)
        return pod

    def _wait_addressed(self, pod: Any, deadline: float) -> Any:
        """Watch the Pod until it has an address (its sandbox and network exist)."""
        from kubernetes import watch

        name, uid = pod.metadata.name, pod.metadata.uid
        version = pod.metadata.resource_version
        while True:
            _check_starting(pod)
            if _addressed(pod):
                return pod
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxStartError("the tenant's pod did not become ready in time")
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in stream.stream(  # type: ignore[no-untyped-call]
                    self._core.list_namespaced_pod,
                    self._settings.namespace,
                    field_selector=f"metadata.name={name}",
                    resource_version=version,
                    timeout_seconds=max(1, int(remaining)),
                    _request_timeout=remaining + API_TIMEOUT,
                ):
                    current = event["object"]
                    if getattr(current, "metadata", None) is None or current.metadata.uid != uid:
                        continue
                    if event["type"] == "DELETED":
                        raise SandboxStartError("the tenant's pod was deleted while starting")
                    pod = current
                    _check_starting(pod)
                    if _addressed(pod):
                        return pod
                    if time.monotonic() >= deadline:
                        break
            except SandboxStartError:
                raise
            except Exception as exc:
                if status_of(exc) not in (None, 410):  # 410: the version is too old; read again
                    raise SandboxStartError(_api_refusal("watch the tenant's pod", exc)) from exc
            finally:
                stream.stop()  # type: ignore[no-untyped-call]
            fresh = self._read(name)
            if fresh is None or fresh.metadata.uid != uid:
                raise SandboxStartError("the tenant's pod was deleted while starting")
            pod, version = fresh, fresh.metadata.resource_version

    def _alive(self, info: SandboxInfo) -> bool:
        try:
            pod = self._read(str(info.details.get("pod") or names.object_name(info.tenant)))
        except SandboxStartError:
            return False  # cannot tell: the lifecycle replaces it, the safe side
        return pod is not None and pod.metadata.uid == info.backend_id and not _dead(pod)

    def _delete(self, name: str, uid: str) -> None:
        """Delete this Pod instance now (grace 0: a sandbox keeps no state worth a goodbye);
        already gone, or replaced by another uid: nothing to do."""
        from kubernetes import client

        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            self._core.delete_namespaced_pod(
                name,
                self._settings.namespace,
                body=options,
                _preload_content=False,
                _request_timeout=API_TIMEOUT,
            ).drain_conn()
        except Exception as exc:
            if status_of(exc) in (404, 409):
                return
            raise ClusterUnavailable(_api_refusal("delete the tenant's pod", exc)) from exc

    def _patch_last_used(self, tenant: str, when: float) -> None:
        """Record a use of the tenant's Pod: a merge patch of its one annotation, the answer
        drained unparsed. No Pod (not created yet, or reaped): 404, nothing to record."""
        patch = {"metadata": {"annotations": {names.LAST_USED: stamp(when)}}}
        try:
            self._core.patch_namespaced_pod(
                names.object_name(tenant),
                self._settings.namespace,
                patch,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=API_TIMEOUT,
            ).drain_conn()
        except Exception as exc:
            if status_of(exc) == 404:
                return
            raise

    def _wait_gone(self, name: str, uid: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            pod = self._read(name)
            if pod is None or pod.metadata.uid != uid:
                return
            time.sleep(0.1)

    def _read(self, name: str) -> Any:
        """The Pod of that name, or None; SandboxStartError when the API fails."""
        try:
            return self._core.read_namespaced_pod(
                name, self._settings.namespace, _request_timeout=API_TIMEOUT
            )
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise SandboxStartError(_api_refusal("read the tenant's pod", exc)) from exc

    def _list(self, tenant: str | None = None) -> list[Any]:
        selector = names.instance_selector(self._instance)
        if tenant is not None:
            selector += f",{names.TENANT}={tenant}"
        try:
            result = self._core.list_namespaced_pod(
                self._settings.namespace, label_selector=selector, _request_timeout=API_TIMEOUT
            )
        except Exception as exc:  # the API away (restarted) or refusing: one line, no traceback
            raise ClusterUnavailable(_api_refusal("list the tenants' pods", exc)) from exc
        return list(result.items)

    def _pushing(self, tenant: str) -> bool:
        """A push Pod of the tenant exists (push.py): on a ReadWriteOnce claim the two take turns."""
        push = f"{names.COMPONENT}={names.PUSH_COMPONENT}"
        selector = f"{push},{names.TENANT}={tenant},{names.INSTANCE}={self._instance}"
        try:
            pods = self._core.list_namespaced_pod(
                self._settings.namespace, label_selector=selector, _request_timeout=API_TIMEOUT
            ).items
        except Exception as exc:
            raise ClusterUnavailable(_api_refusal("list the tenants' pods", exc)) from exc
        return any(not _finished(pod) for pod in pods)

    def _info(self, pod: Any, *, adopted: bool, serving: bool = False) -> SandboxInfo:
        """`serving`: both its ports were seen accepting (the API may still say Pending)."""
        labels = pod.metadata.labels or {}
        tenant = labels.get(names.TENANT, "")
        ip = pod.status.pod_ip if pod.status is not None else None
        now = time.monotonic()
        details: dict[str, Any] = {"pod": pod.metadata.name, "replica": labels.get(names.REPLICA, "")}
        if adopted:
            details["adopted"] = True
        return SandboxInfo(
            tenant=tenant,
            # started, not the kubelet's Ready: the lifecycle connects to it itself
            state=SandboxState.RUNNING if serving or _started(pod) else SandboxState.FAILED,
            endpoint=self._endpoint(tenant, ip) if ip and tenant else None,
            backend_id=pod.metadata.uid,
            started_at=now,
            last_used=now,
            details=details,
        )

    def _endpoint(self, tenant: str, ip: str) -> Endpoint:
        from broker.master_key import sandbox_key

        host = f"[{ip}]" if ":" in ip else ip
        return Endpoint(
            url=f"http://{host}:{names.MCP_PORT}/mcp",
            token=sandbox_key(self._master_key, tenant),
            keeper_url=f"http://{host}:{names.KEEPER_PORT}",
        )


# --- Pod states -------------------------------------------------------------------------------------


def _finished(pod: Any) -> bool:
    return pod.status is not None and pod.status.phase in ("Failed", "Succeeded")


def _dead(pod: Any) -> bool:
    """Finished, being deleted, or a container has died or restarted: one that did is not the
    sandbox the broker admitted (its pinned contract, its state). A Pod the API still calls
    Pending is not dead: the broker may have seen its ports open before the kubelet's report."""
    if _finished(pod) or pod.metadata.deletion_timestamp is not None:
        return True
    for status in (pod.status.container_statuses if pod.status is not None else None) or ():
        if status.restart_count or (status.state is not None and status.state.terminated is not None):
            return True
    return False


def _healthy(pod: Any) -> bool:
    """Running by the API's account, and not dead."""
    return pod.status is not None and pod.status.phase == "Running" and not _dead(pod)


def _addressed(pod: Any) -> bool:
    """Not dead, and has an address: its servers can be tried."""
    return pod.status is not None and bool(pod.status.pod_ip) and not _dead(pod)


def _started(pod: Any) -> bool:
    """Every container running (none waiting), and an address."""
    if pod.status is None or not pod.status.pod_ip or not _healthy(pod):
        return False
    statuses = pod.status.container_statuses or ()
    return bool(statuses) and all(c.state is not None and c.state.running is not None for c in statuses)


def _accepts(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _check_starting(pod: Any) -> None:
    """Fail at once, with what to do, where waiting cannot help."""
    if _finished(pod) or pod.metadata.deletion_timestamp is not None:
        raise SandboxStartError("the tenant's pod stopped while starting")
    status = pod.status
    for c in (status.conditions if status is not None else None) or ():
        if c.type == "PodScheduled" and c.status == "False" and "persistentvolumeclaim" in (c.message or ""):
            raise SandboxStartError(
                "the tenant's volumes do not exist: apply `docbroker tenant manifest TENANT` first"
            )
    for cs in (status.container_statuses if status is not None else None) or ():
        waiting = cs.state.waiting if cs.state is not None else None
        if waiting is not None and waiting.reason in ("ErrImageNeverPull", "InvalidImageName"):
            raise SandboxStartError(f"the tenant's pod cannot get its image ({waiting.reason})")
        if waiting is not None and waiting.reason == "CreateContainerError":
            # e.g. the Localhost seccomp profile is not on the node: waiting will not help
            raise SandboxStartError("the node cannot create the tenant's containers (run `docbroker doctor`)")
        if cs.state is not None and cs.state.terminated is not None:
            raise SandboxStartError("a container of the tenant's pod exited while starting")


def _drain(response: Any) -> None:
    """Discard an answer unread (a Secret's would hold its keys)."""
    response.drain_conn()
    response.release_conn()


def _api_refusal(what: str, exc: BaseException) -> str:
    status = status_of(exc)
    if status is None:
        return f"the Kubernetes API did not answer when asked to {what}"
    return f"the Kubernetes API refused to {what} (HTTP {status})"
