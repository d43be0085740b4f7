"""Docker backend: one hardened container per tenant, MCP over a unix socket (DESIGN §7).

    backend = await DockerBackend.connect(settings.runtime.docker)
    runtime = Runtime(backend, tenants.provision, ...)

Each container gets, and why:

- user 10001 (`sandbox_user`), `cap_drop ALL`, `no-new-privileges`: no root, no capabilities,
  no setuid escalation. The group depends on the daemon: under a rootless one, gid 0, which
  there is the broker user's own gid on the host — how the broker reads reports (mode 0o040)
  and connects to the socket (mode 0o770) while the sandbox's uid cannot read its own reports
  back. Anywhere else container gid 0 is the host's root group (DESIGN §7: never), so the
  sandbox gets a dedicated group, 10001; the broker, root there, reads and connects as before.
- `policies/seccomp.json`: an allow-list (default EPERM) without the chmod/chown/unlink/rename
  family, namespaces, mount, ptrace, bpf, io_uring, keyctl, userfaultfd, and with AF_UNIX
  as the only socket family.
- read-only root fs, a small `noexec,nosuid,nodev` tmpfs on /tmp: nothing written can be run.
- `network_mode="none"`: only `lo`; the MCP socket is a bind-mounted file, not a port.
- memory (swap = memory), CPU, pids, nofile limits — enforced only where the daemon has
  cgroups; `describe()` says which (a rootless daemon on cgroup v1 has none).
- mounts: sources read-only, the drop-box read-write, the tenant's secret read-only as one
  file, the run dir for the socket. Never the Docker socket, never a host system folder.
- labels naming the tenant and the replica that started it, so a restarted broker finds
  (adopts) its containers, and replicas on one daemon share them (see Replicas below).

Replicas: the daemon is the source of truth. A tenant's container has a fixed name, so of
replicas racing to start one, the daemon lets one create it (or rename a warm one to it) and
the others get a conflict and adopt the winner's. A warm spare carries its replica's label and
a per-process tag in its name: a starting replica leaves a live peer's spares alone and
removes those of replicas that are gone.

Paths inside the sandbox: DOCS_ROOT=/srv/docs (sources/, reports/ = drop-box), the socket
/run/docs/mcp.sock, the secret /run/secrets/approval.key. DESIGN §1 draws the secret at
/run/docs/approval.key; it moved to its own read-only mount because /run/docs is the
writable run dir the socket lives in, shared with the host.

Every blocking SDK call runs on the backend's own bounded thread pool, each with a timeout
(DOCBROKER_DOCKER_API_TIMEOUT, never above the start timeout): a hung daemon fails Docker's
calls in time and leaves the event loop's default executor to the rest of the broker.
"""

from broker.runtime.docker.backend import DaemonUnavailable, DockerBackend, ImageMissing
from broker.runtime.docker.hardening import load_seccomp_profile, sandbox_user

__all__ = ["DaemonUnavailable", "DockerBackend", "ImageMissing", "load_seccomp_profile", "sandbox_user"]
