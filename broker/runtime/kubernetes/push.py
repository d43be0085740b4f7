"""`docbroker tenant sources push TENANT DIR`: a tenant's documents into its sources PVC.

Why a short-lived Pod and the exec API: the sources PVC is mounted read-only by the tenant's
server and by nothing else; the operator's machine cannot reach the volume, and a Secret or
ConfigMap is too small for documents. So:

1. The folder is checked here first, with the server's own rules (server.contracts): at most
   MAX_SCAN_ENTRIES entries (what a search examines), each a regular file (no link, no FIFO,
   no folder: broker/files.open_regular), named by FILENAME_RE, at most MAX_DOCUMENT_BYTES,
   UTF-8 — what the server would refuse to read is refused before anything reaches the cluster.
2. A restricted Pod (the keeper image: it has Python; non-root, read-only root, no API token,
   no service links, every capability dropped, RuntimeDefault seccomp) mounts the sources PVC
   read-write and sleeps; `activeDeadlineSeconds` ends it even if this process dies.
3. The files go as one JSON line on the exec's stdin (the API's websocket; 1.20's exec protocol
   cannot close stdin, so the receiver reads exactly one line). The receiver checks the names,
   sizes and count again (it trusts nothing on its stdin), writes every file into a fresh
   staging folder on the volume, renames each into place (one rename per file: a reader sees
   the old file or the new, never a part), then removes the documents not in the new set.
4. The Pod is deleted in every case (`finally`: failures and Ctrl-C too) and waited for.

What it is not: one atomic swap of the whole set. The tenant's server reads the PVC's root,
which cannot be renamed; a search running during a push may see some old and some new files.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.files import UnsafeFileError, open_regular
from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.podspec import POD_GID, seccomp_profile
from broker.settings import KubernetesSettings
from server.contracts import FILENAME_PATTERN, FILENAME_RE, MAX_DOCUMENT_BYTES, MAX_SCAN_ENTRIES

PUSH_UID = 10003  # neither the server's nor the keeper's: the files' owner is neither of them
PUSH_COMPONENT = names.PUSH_COMPONENT  # not "sandbox": the broker's discovery must never adopt it
SOURCES_MOUNT = "/sources"
PYTHON = "/opt/venv/bin/python"
DEADLINE_SECONDS = 600  # the Pod ends itself if this process is killed before its `finally`
FILE_MODE = 0o640  # the server reads as gid POD_GID (fsGroup)
# One line of JSON: names, base64 of each file (4/3), quotes and commas.
PAYLOAD_LIMIT = MAX_SCAN_ENTRIES * (MAX_DOCUMENT_BYTES * 4 // 3 + 200) + 64
STDIN_CHUNK = 64 * 1024


class PushRefused(Exception):
    """The folder breaks a rule: one line, naming the rule, never a file's name or content."""


class PushFailed(Exception):
    """The cluster side failed: one line."""


class VolumeNotWritable(PushFailed):
    """The receiver could not write in the volume's root: the kubelet did not give it the push
    Pod's fsGroup. Most volume plugins do that on a mount only when no other Pod has the volume
    mounted (the local one counts the other Pods' mounts first), and some never do (NFS, hostPath)."""


NOT_WRITABLE = (
    f"the sources volume's root is not writable by the push Pod's group ({POD_GID}): the volume "
    "did not get its fsGroup (another Pod had it mounted, or the storage ignores fsGroup; see "
    "docs/kubernetes.md, Storage)"
)


@dataclass(frozen=True)
class Source:
    name: str
    data: bytes


def collect(folder: Path) -> list[Source]:
    """The folder's documents, checked as the server would; PushRefused on the first problem."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise PushRefused("the folder cannot be opened (missing, not a folder, or a link)") from None
    try:
        entries = sorted(os.listdir(dir_fd))
    finally:
        os.close(dir_fd)
    if len(entries) > MAX_SCAN_ENTRIES:
        raise PushRefused(f"more than {MAX_SCAN_ENTRIES} entries (a search examines no more)")
    sources = []
    for name in entries:
        if not FILENAME_RE.fullmatch(name):
            raise PushRefused("an entry's name breaks the server's rule (letters, digits, _ -, then .md)")
        sources.append(Source(name, _read(folder / name)))
    return sources


def _read(path: Path) -> bytes:
    try:
        fd = open_regular(path, follow_links=False)
    except UnsafeFileError:
        raise PushRefused("an entry is not a regular file (a link, a FIFO, a folder, a device)") from None
    try:
        if os.fstat(fd).st_size > MAX_DOCUMENT_BYTES:
            raise PushRefused(f"a document is larger than {MAX_DOCUMENT_BYTES} bytes")
        chunks = []
        size = 0
        while chunk := os.read(fd, MAX_DOCUMENT_BYTES + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_DOCUMENT_BYTES:
                raise PushRefused(f"a document is larger than {MAX_DOCUMENT_BYTES} bytes")
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise PushRefused("a document is not UTF-8 text") from None
    return data


def payload(sources: list[Source]) -> str:
    import base64

    line = json.dumps([[s.name, base64.b64encode(s.data).decode("ascii")] for s in sources])
    return line + "\n"


# Runs in the push Pod as `python -I -S -c RECEIVER`: the standard library only.
RECEIVER = f"""
import base64, json, os, re, secrets, shutil, stat, sys
ROOT = {SOURCES_MOUNT!r}
NAME = re.compile({FILENAME_PATTERN!r})
def fail(code):
    print(json.dumps({{"ok": False, "error": code}})); sys.exit(1)
line = sys.stdin.buffer.readline({PAYLOAD_LIMIT} + 1)
if len(line) > {PAYLOAD_LIMIT} or not line.endswith(b"\\n"):
    fail("payload_too_large_or_cut")
try:
    files = [(n, base64.b64decode(d, validate=True)) for n, d in json.loads(line)]
except Exception:
    fail("payload_malformed")
if len(files) > {MAX_SCAN_ENTRIES} or len({{n for n, _ in files}}) != len(files):
    fail("too_many_or_repeated")
for n, d in files:
    if not isinstance(n, str) or not NAME.fullmatch(n) or len(d) > {MAX_DOCUMENT_BYTES}:
        fail("bad_name_or_size")
for entry in os.scandir(ROOT):  # a push that died half-way left its staging folder
    if entry.name.startswith(".push-") and entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path)
stage = os.path.join(ROOT, ".push-" + secrets.token_hex(8))
try:
    os.mkdir(stage, 0o700)
except PermissionError:  # the volume's root did not get the Pod's fsGroup (push.VolumeNotWritable)
    fail("volume_not_writable")
for n, d in files:
    fd = os.open(os.path.join(stage, n), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, {FILE_MODE:#o})
    try:
        view = memoryview(d)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, {FILE_MODE:#o})
        os.fsync(fd)
    finally:
        os.close(fd)
keep = {{n for n, _ in files}}
for n in sorted(keep):
    os.rename(os.path.join(stage, n), os.path.join(ROOT, n))
removed = 0
for entry in os.scandir(ROOT):
    if NAME.fullmatch(entry.name) and entry.name not in keep:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
        removed += 1
os.rmdir(stage)
root = os.open(ROOT, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(root)
os.close(root)
print(json.dumps({{"ok": True, "files": len(files), "removed": removed}}))
"""


def push_pod(settings: KubernetesSettings, tenant: str, *, instance: str, suffix: str) -> dict[str, Any]:
    """The short-lived Pod: restricted (runtime/podsecurity.check_pod_spec), the sources PVC
    read-write, a sleeping Python the exec runs the receiver beside."""
    runtime_default = seccomp_profile("RuntimeDefault")
    container = {
        "name": "push",
        "image": settings.keeper_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [PYTHON, "-I", "-S", "-c", f"import time; time.sleep({DEADLINE_SECONDS})"],
        "resources": {
            "limits": {"cpu": "500m", "memory": "128Mi"},
            "requests": {"cpu": "50m", "memory": "128Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PUSH_UID,
            "runAsGroup": POD_GID,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": runtime_default,
        },
        "volumeMounts": [{"name": "sources", "mountPath": SOURCES_MOUNT}],
    }
    labels = {
        names.PART_OF: "docbroker",
        names.COMPONENT: PUSH_COMPONENT,
        names.TENANT: tenant,
        names.INSTANCE: instance,
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": DEADLINE_SECONDS,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PUSH_UID,
            "runAsGroup": POD_GID,
            # The volume's files get group POD_GID (the server's group) and group write.
            "fsGroup": POD_GID,
            "supplementalGroups": [POD_GID],
            "seccompProfile": runtime_default,
        },
        "containers": [container],
        "volumes": [
            {"name": "sources", "persistentVolumeClaim": {"claimName": names.sources_claim(tenant)}},
        ],
    }
    if settings.runtime_class:
        spec["runtimeClassName"] = settings.runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{names.object_name(tenant)}-push-{suffix}",
            "namespace": settings.namespace,
            "labels": labels,
        },
        "spec": spec,
    }


def push(
    api: Any,
    settings: KubernetesSettings,
    tenant: str,
    sources: list[Source],
    *,
    instance: str,
    timeout: float,
    on_pod: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Create the Pod, send the files, delete the Pod (always). The receiver's JSON answer."""
    from kubernetes import client

    from broker.runtime.kubernetes.client import status_of

    core: Any = client.CoreV1Api(api)  # bodies are dicts, as the backend's
    ns = settings.namespace
    try:
        claim = core.read_namespaced_persistent_volume_claim(
            names.sources_claim(tenant), ns, _request_timeout=30
        )
    except Exception as exc:
        if status_of(exc) == 404:
            raise PushFailed("the tenant has no sources PVC (see `docbroker tenant manifest`)") from None
        raise PushFailed(f"the API refused reading the sources PVC ({_why(exc)})") from None
    # A claim without ReadOnlyMany (ReadWriteOnce: block storage) is mounted by one side at a
    # time: the tenant's Pod is stopped before the push Pod mounts it, and brokers start none
    # while the push Pod exists (backend._pushing); the next call starts it again.
    exclusive = "ReadOnlyMany" not in (claim.spec.access_modes or ())
    stopped = 0
    # Two Pods at most, on a ReadWriteOnce claim only: there the volume's root not writable means
    # a tenant Pod's mount was still there when the push Pod's was made (stopped or started
    # meanwhile, see below), and a second Pod, made once the first is gone and the tenant's are
    # stopped again, mounts it alone. A ReadOnlyMany claim stays shared: one Pod, one answer.
    for attempt in (1, 2):
        if exclusive:  # before each push Pod (a broker may start one while no push Pod exists)
            stopped += _stop_tenant_pods(core, tenant, ns, instance, timeout)
        name = _create_push_pod(core, settings, tenant, instance)
        on_pod(name)
        try:
            if exclusive:  # one a broker started between the check above and the push Pod
                stopped += _stop_tenant_pods(core, tenant, ns, instance, timeout)
            _wait_running(core, name, ns, timeout)
            answer = _send(core, name, ns, payload(sources), timeout)
        except VolumeNotWritable:
            if exclusive and attempt == 1:
                continue  # the `finally` below has deleted this Pod and waited until it was gone
            raise
        finally:
            _delete(core, name, ns)
        return {**answer, "exclusive": exclusive, "stopped": stopped, "attempts": attempt}
    raise AssertionError("unreachable: the second attempt returns or raises")


def _create_push_pod(core: Any, settings: KubernetesSettings, tenant: str, instance: str) -> str:
    """The push Pod, checked and created; its name."""
    from broker.runtime.podsecurity import check_pod_spec

    pod = push_pod(settings, tenant, instance=instance, suffix=secrets.token_hex(3))
    # The same self-check as the tenant Pod's (tenant=True: no API token, no service links).
    if check_pod_spec(pod["spec"], metadata=pod["metadata"], tenant=True):
        raise PushFailed("the push Pod fails the restricted Pod Security check (runtime/podsecurity)")
    try:
        core.create_namespaced_pod(settings.namespace, pod, _request_timeout=30)
    except Exception as exc:
        raise PushFailed(f"the API refused the push Pod ({_why(exc)})") from None
    return str(pod["metadata"]["name"])


def _stop_tenant_pods(core: Any, tenant: str, ns: str, instance: str, timeout: float) -> int:
    """Delete the tenant's Pod(s) and wait until none is left; how many were deleted."""
    selector = f"{names.instance_selector(instance)},{names.TENANT}={tenant}"
    deadline = time.monotonic() + timeout
    deleted: set[str] = set()
    while True:
        try:
            pods = core.list_namespaced_pod(ns, label_selector=selector, _request_timeout=30).items
        except Exception as exc:
            raise PushFailed(f"the API refused listing the tenant's Pod ({_why(exc)})") from None
        if not pods:
            return len(deleted)
        for pod in pods:
            if pod.metadata.uid not in deleted:
                _delete_quietly(core, pod.metadata.name, ns)
                deleted.add(pod.metadata.uid)
        if time.monotonic() > deadline:
            raise PushFailed(f"the tenant's Pod was still there after {timeout:.0f}s (it holds the volume)")
        time.sleep(0.25)


def _delete_quietly(core: Any, name: str, ns: str) -> None:
    from broker.runtime.kubernetes.client import status_of

    try:
        core.delete_namespaced_pod(name, ns, _request_timeout=30)
    except Exception as exc:
        if status_of(exc) != 404:
            raise PushFailed(f"the API refused deleting the tenant's Pod ({_why(exc)})") from None


def _why(exc: BaseException) -> str:
    from broker.runtime.kubernetes.client import status_of

    status = status_of(exc)
    return f"HTTP {status}" if status is not None else type(exc).__name__


def _wait_running(core: Any, name: str, ns: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, ns, _request_timeout=30)
        phase = pod.status.phase if pod.status else None
        if phase == "Running":
            return
        if phase in ("Failed", "Succeeded"):
            raise PushFailed(f"the push Pod ended before the files were sent ({phase})")
        if time.monotonic() > deadline:
            raise PushFailed(f"the push Pod was not running after {timeout:.0f}s (image, volume, policy?)")
        time.sleep(0.25)


def _send(core: Any, name: str, ns: str, line: str, timeout: float) -> dict[str, Any]:
    from kubernetes.stream import stream

    ws = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        ns,
        container="push",
        command=[PYTHON, "-I", "-S", "-c", RECEIVER],
        stdin=True,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    out: list[str] = []
    err_bytes = 0
    try:
        for start in range(0, len(line), STDIN_CHUNK):
            ws.write_stdin(line[start : start + STDIN_CHUNK])
        deadline = time.monotonic() + timeout
        while ws.is_open():
            if time.monotonic() > deadline:
                raise PushFailed(f"the push did not finish in {timeout:.0f}s")
            ws.update(timeout=1)
            if ws.peek_stdout():
                out.append(ws.read_stdout())
            if ws.peek_stderr():
                err_bytes += len(ws.read_stderr())  # counted, never shown: it may quote a name
        returncode = ws.returncode
    finally:
        ws.close()
    answers = [x for x in "".join(out).splitlines() if x.startswith("{")]
    try:
        answer = dict(json.loads(answers[-1]))
    except (IndexError, ValueError):
        raise PushFailed(f"the receiver failed (exit {returncode}, {err_bytes} bytes on stderr)") from None
    if answer.get("error") == "volume_not_writable":
        raise VolumeNotWritable(NOT_WRITABLE)
    if not answer.get("ok") or returncode != 0:
        raise PushFailed(f"the receiver refused: {answer.get('error', 'unknown')}")
    return answer


def _delete(core: Any, name: str, ns: str) -> None:
    """Delete and wait until gone (bounded): the next push may want the volume again. Gracefully
    (its 1 s), not forced: the API keeps a gracefully deleted Pod until the kubelet has unmounted
    its volumes, a forced one goes at once, its mount still there."""
    from broker.runtime.kubernetes.client import status_of

    try:
        core.delete_namespaced_pod(name, ns, _request_timeout=30)
    except Exception as exc:
        if status_of(exc) == 404:
            return
        raise PushFailed(f"the push Pod could not be deleted ({_why(exc)}); delete it by hand") from None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_pod(name, ns, _request_timeout=30)
        except Exception as exc:
            if status_of(exc) == 404:
                return
        time.sleep(0.25)
