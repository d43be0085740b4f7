"""The reports keeper: DESIGN §7's drop-box, carried over to a tenant's Pod.

On Docker the broker itself empties a sandbox's drop-box into the tenant's reports store, both
folders on its own host. On Kubernetes the reports live on a PVC in the tenant's Pod, and the
broker (another Pod, maybe on another node) has no file access to it. So a second, trusted
container in the tenant's Pod does what `ReportStore` does on Docker, with the same code
(`broker.approvals.reports.ReportFiles`), and the broker asks it over HTTP
(`broker.approvals.keeper_client`):

- **Two containers, two uids.** `server` (uid 10001, the document tools, untrusted: it parses
  documents) and `keeper` (uid 10002, this package, from the broker image). They share one
  emptyDir, the drop-box: made by the keeper's postStart hook as its folder, mode 1733 (the
  kubelet starts the server only after that hook; the keeper refuses any other), so the
  server can create a file there but cannot list it, nor remove or rename what is not its own.
  The Pod's fsGroup (10001) is the group of what the server creates: it writes reports with
  mode 0o040, so it cannot read back its own file while the keeper, by that group, can.
- **Only the keeper mounts the reports PVC.** A volume a container does not mount does not
  exist for it: no permission bit, seccomp profile or kernel bug in file handling stands
  between a compromised server and a report written earlier, because there is no path at all.
  (The lab showed why permissions and seccomp alone are not enough: under `RuntimeDefault`
  a report's owner could chmod, delete and rename it.)
- **What lands is what was approved.** The keeper accepts a dropped file only if it is a
  regular file with one link whose bytes hash to the sha256 the human approved; it writes its
  own copy (O_EXCL: an existing report is never overwritten) and quarantines everything else
  (symlinks, FIFOs, hard links, other bytes, planted names) into `quarantine/` beside the
  drop-box folder in the emptyDir (a rename cannot cross into the PVC; the server mounts only
  the drop-box folder, so it cannot reach the quarantine). Quarantined files therefore live as
  long as the Pod; what was quarantined, by count and reason, is in the broker's audit.
- **Only the broker can call it.** Every request needs `Authorization: Bearer <keeper key>`
  (`keeper_key(master, tenant)`, DESIGN §10), compared in constant time. The keeper key is
  mounted only into the keeper container (the tenant Secret's `items:`); the server container
  gets `approval-secret` and `sandbox-key` and nothing else. So a compromised server, though it
  shares the Pod's network namespace and can reach 127.0.0.1:8081, cannot make the keeper
  accept, sweep or say whether a report exists: it has no key, cannot read the keeper's files
  (another uid, and /proc of another uid's process is closed to it without ptrace), and its
  seccomp profile refuses ptrace. The keys are per tenant: one tenant's key opens no other
  tenant's keeper.

The keeper logs no file name, no hash and no key: only errno names of failed file operations.

    python -m broker.keeper --http 0.0.0.0:8081
    env: KEEPER_DROPBOX (the drop-box: a folder inside the emptyDir), KEEPER_REPORTS (the PVC),
         KEEPER_KEY_FILE (the keeper key)

    POST /v1/turn   {"reason": "dropbox_before_save", "seconds": "90"}
                                                           → {"turn": "<id>", "quarantined": 0, "stuck": 0}
    POST /v1/sweep  {"reason": "dropbox_before_save"}       → {"quarantined": 0, "stuck": 0}
                    (with "turn": the save's sweep after, which ends its turn)
    POST /v1/accept {"name": "q3.md", "sha256": "<64 hex>"}  → {"accepted": "ok"}
    POST /v1/exists {"name": "q3.md"}                         → {"exists": false}
"""
