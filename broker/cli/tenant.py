"""`docbroker tenant add|list|show|remove|manifest`: the tenants of this host.

A tenant is known when its policy file exists (broker/tenants.py); its folders, secret and
run dir live in the data dir. The broker reads policies when it starts: after `add` or
`remove`, restart the brokers (each says so on stderr). `remove` keeps the audit log (it is
the deployment's, not the tenant's) and asks before deleting the tenant's reports.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.cli.base import (
    CliError,
    Subparsers,
    UsageError,
    json_flag,
    load_settings,
    note,
    print_fields,
    print_json,
    print_table,
    progress,
)
from broker.settings import Settings

if TYPE_CHECKING:
    from broker.tenants import Tenants

# server.contracts (pydantic) and broker.tenants are imported where used: `--help` stays fast.
RESTART = "restart the broker(s) to apply: policies are read when a broker starts"


def register(sub: Subparsers) -> None:
    tenant = sub.add_parser(
        "tenant", help="tenants: add, list, show, remove; their Kubernetes manifest and sources"
    )
    commands = tenant.add_subparsers(dest="tenant_command", required=True, metavar="COMMAND")

    add = commands.add_parser("add", help="provision a tenant: folders, secret, policy file")
    add.add_argument("name", help="the tenant id (a DNS label)")
    json_flag(add)
    add.set_defaults(func=cmd_add)

    listing = commands.add_parser("list", help="the tenants: policy, folders, counts of sources and reports")
    json_flag(listing)
    listing.set_defaults(func=cmd_list)

    show = commands.add_parser("show", help="one tenant: its effective policy, folders and counts")
    show.add_argument("name")
    json_flag(show)
    show.set_defaults(func=cmd_show)

    remove = commands.add_parser(
        "remove",
        help="remove a tenant: policy, sandbox, sources, secret; reports after asking; the audit stays",
    )
    remove.add_argument("name")
    choice = remove.add_mutually_exclusive_group()
    choice.add_argument("--yes", action="store_true", help="delete the tenant's reports without asking")
    choice.add_argument("--keep-reports", action="store_true", help="keep the tenant's reports folder")
    json_flag(remove)
    remove.set_defaults(func=cmd_remove)

    manifest = commands.add_parser("manifest", help="the tenant's Kubernetes PVCs (and Secret) as YAML")
    manifest.add_argument("manifest_of", metavar="name")
    manifest.add_argument("--secret", action="store_true", help="add the Secret (master key)")
    manifest.add_argument("--storage-class", help="the PVCs' storage class (both, unless set apart)")
    manifest.add_argument("--sources-storage-class", help="the sources PVC's storage class")
    manifest.add_argument("--reports-storage-class", help="the reports PVC's storage class")
    manifest.add_argument(
        "--sources-access-mode",
        choices=("ReadOnlyMany", "ReadWriteOnce"),
        help="the sources PVC's access mode (default DOCBROKER_KUBE_SOURCES_ACCESS_MODE, ReadOnlyMany)",
    )
    manifest.add_argument("--sources-size", default="1Gi", help="the sources PVC's size")
    manifest.add_argument("--reports-size", default="1Gi", help="the reports PVC's size")
    manifest.set_defaults(func=cmd_manifest)

    sources = commands.add_parser("sources", help="the tenant's documents on Kubernetes: push a folder")
    sources_commands = sources.add_subparsers(dest="sources_command", required=True, metavar="COMMAND")
    push = sources_commands.add_parser(
        "push",
        help="replace the tenant's sources PVC with a folder's documents (a short-lived restricted Pod)",
    )
    push.add_argument("push_tenant", metavar="TENANT")
    push.add_argument("folder", metavar="DIR", type=Path, help="a flat folder of .md documents")
    push.add_argument("--timeout", type=float, default=120.0, help="seconds for the Pod to start; to write")
    json_flag(push)
    push.set_defaults(func=cmd_sources_push)


def _name(name: str) -> str:
    from server.contracts import TENANT_RE

    if not TENANT_RE.fullmatch(name):
        raise UsageError("not a tenant id (a DNS label)")
    return name


def _tenants(settings: Settings) -> Tenants:
    from broker.master_key import create_master_key, load_master_key
    from broker.tenants import Tenants

    create_master_key(settings.master_key_file)
    return Tenants(settings, load_master_key(settings.master_key_file))


def _policy_file(settings: Settings, name: str) -> Path:
    return settings.policies_dir / "tenants" / f"{name}.toml"


def _count(folder: Path) -> int | None:
    """Entries in a folder (never their names); None when it does not exist."""
    try:
        return sum(1 for _ in folder.iterdir())
    except FileNotFoundError:
        return None


def _facts(settings: Settings, name: str) -> dict[str, Any]:
    tenant_dir = settings.tenants_dir / name
    return {
        "tenant": name,
        "policy": _policy_file(settings, name).is_file(),
        "folders": tenant_dir.is_dir(),
        "sources": _count(tenant_dir / "docs" / "sources"),
        "reports": _count(tenant_dir / "reports"),
        "quarantined": _count(tenant_dir / "quarantine"),
    }


def cmd_add(args: argparse.Namespace) -> int:
    name = _name(args.name)
    settings = load_settings()
    try:
        spec = _tenants(settings).provision(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    policy = _policy_file(settings, name)
    if not policy.exists():
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(f"# Tenant {name}: overrides of policies/default.toml\n")
    result = {"tenant": name, "sources": spec.sources_dir, "policy": str(policy)}
    if args.json:
        print_json(result)
    else:
        print_fields(list(result.items()))
    note(RESTART)
    return 0


def _known(settings: Settings) -> list[str]:
    from broker.tenants import Tenants
    from server.contracts import TENANT_RE

    folder = settings.policies_dir / "tenants"
    with_policy = (
        {p.stem for p in folder.glob("*.toml") if TENANT_RE.fullmatch(p.stem)} if folder.is_dir() else set()
    )
    with_folders = set(Tenants(settings, b"").provisioned())
    return sorted(with_policy | with_folders)


def cmd_list(args: argparse.Namespace) -> int:
    settings = load_settings()
    rows = [_facts(settings, name) for name in _known(settings)]
    if args.json:
        print_json({"tenants": rows})
        return 0
    columns = ["tenant", "policy", "folders", "sources", "reports", "quarantined"]
    print_table(columns, [[_yes(row[c]) for c in columns] for row in rows])
    return 0


def _yes(value: object) -> object:
    return {True: "yes", False: "no"}.get(value, value) if isinstance(value, bool) else value


def cmd_show(args: argparse.Namespace) -> int:
    from broker.policy import Policies, PolicyError

    name = _name(args.name)
    settings = load_settings()
    facts = _facts(settings, name)
    if not facts["policy"] and not facts["folders"]:
        raise CliError("no such tenant")
    try:
        policies = Policies.load(settings.policies_dir)
    except PolicyError as exc:  # names the file and key, never a value
        raise CliError(f"policies: {exc}") from None
    if policies.known(name):
        p = policies.get(name)
        facts["effective_policy"] = {
            "tools.allowed": sorted(p.allowed_tools),
            "limits.rate_per_minute": p.rate_per_minute,
            "limits.burst": p.burst,
            "limits.max_concurrent": p.max_concurrent,
            "limits.max_streams": p.max_streams,
            "approvals.require_distinct_approver": p.require_distinct_approver,
            "approvals.max_pending": p.max_pending_approvals,
        }
    if args.json:
        print_json(facts)
        return 0
    effective = facts.pop("effective_policy", {})
    print_fields([(k, _yes(v)) for k, v in facts.items()])
    for key, value in effective.items():
        sys.stdout.write(f"  {key} = {', '.join(value) if isinstance(value, list) else _yes(value)}\n")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from broker.cli.base import confirm
    from broker.cli.sandbox import remove_sandboxes

    name = _name(args.name)
    settings = load_settings()
    facts = _facts(settings, name)
    if not facts["policy"] and not facts["folders"]:
        raise CliError("no such tenant")
    reports = facts["reports"] or 0
    delete_reports = args.yes or (
        not args.keep_reports
        and (reports == 0 or confirm(f"delete the tenant's {reports} report(s)?", "--yes or --keep-reports"))
    )
    # The sandbox first: a running one holds the folders below open, and a failure to reach
    # the engine leaves everything as it was.
    sandboxes = remove_sandboxes(settings, name)
    _policy_file(settings, name).unlink(missing_ok=True)
    tenant_dir = settings.tenants_dir / name
    for folder in (tenant_dir / "docs", tenant_dir / "quarantine", settings.run_dir / name):
        shutil.rmtree(folder, ignore_errors=True)
    (settings.secrets_dir / f"{name}.key").unlink(missing_ok=True)
    if delete_reports:
        shutil.rmtree(tenant_dir, ignore_errors=True)
    result = {
        "tenant": name,
        "removed": True,
        "sandboxes_removed": sandboxes,
        "reports": "deleted" if delete_reports else "kept",
        "audit": "kept",
    }
    if args.json:
        print_json(result)
    else:
        print_fields([(k, _yes(v)) for k, v in result.items()])
    note(RESTART)
    return 0


def cmd_manifest(args: argparse.Namespace) -> int:
    """Namespace and instance from DOCBROKER_KUBE_NAMESPACE / DOCBROKER_INSTANCE."""
    from broker.master_key import MasterKeyError, load_master_key
    from broker.runtime.kubernetes.manifest import tenant_objects, to_yaml
    from broker.settings import (
        INSTANCE_RE,
        KUBE_QUANTITY_RE,
        SettingsError,
        kubernetes_from_env,
        master_key_file_from_env,
    )
    from server.contracts import TENANT_RE

    tenant = args.manifest_of
    if not TENANT_RE.fullmatch(tenant):
        raise SystemExit("docbroker tenant manifest: not a tenant id (a DNS label)")
    for flag, value in (("--sources-size", args.sources_size), ("--reports-size", args.reports_size)):
        if not KUBE_QUANTITY_RE.fullmatch(value):
            raise SystemExit(f"docbroker tenant manifest: {flag} must be a quantity such as 1Gi")
    for flag, value in (
        ("--storage-class", args.storage_class),
        ("--sources-storage-class", args.sources_storage_class),
        ("--reports-storage-class", args.reports_storage_class),
    ):
        if value is not None and not INSTANCE_RE.fullmatch(value):
            raise SystemExit(f"docbroker tenant manifest: {flag} must be a DNS label")
    try:
        kube, instance = kubernetes_from_env(by_digest=False)  # PVCs and a Secret: no image
    except SettingsError as exc:
        raise SystemExit(f"docbroker tenant manifest: {exc}") from None
    master_key = None
    if args.secret:
        try:
            master_key = load_master_key(master_key_file_from_env())
        except MasterKeyError as exc:
            raise SystemExit(f"docbroker tenant manifest: {exc}") from None
    objects = tenant_objects(
        tenant,
        namespace=kube.namespace,
        instance=instance,
        sources_size=args.sources_size,
        reports_size=args.reports_size,
        storage_class=args.storage_class,
        sources_storage_class=args.sources_storage_class,
        reports_storage_class=args.reports_storage_class,
        sources_access_mode=args.sources_access_mode or kube.sources_access_mode,
        master_key=master_key,
    )
    sys.stdout.write(to_yaml(objects))
    return 0


def cmd_sources_push(args: argparse.Namespace) -> int:
    """Checks the folder, then the settings, then the cluster: a folder that breaks a rule is
    refused before anything is created on it."""
    from broker.runtime.kubernetes.client import ClusterUnavailable, api_client
    from broker.runtime.kubernetes.push import PushFailed, PushRefused, collect, push
    from broker.settings import SettingsError, kubernetes_from_env

    name = _name(args.push_tenant)
    if not args.timeout > 0:
        raise UsageError("--timeout must be positive")
    try:
        sources = collect(args.folder)
    except PushRefused as exc:
        raise UsageError(f"refused: {exc}") from None
    try:
        kube, instance = kubernetes_from_env()
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    try:
        api = api_client(kube.kubeconfig)
    except ClusterUnavailable as exc:
        raise CliError(str(exc)) from None
    try:
        with progress(f"pushing {len(sources)} document(s)"):
            answer = push(api, kube, name, sources, instance=instance, timeout=args.timeout)
    except PushFailed as exc:
        raise CliError(str(exc)) from None
    finally:
        api.close()
    result = {
        "tenant": name,
        "documents": answer["files"],
        "removed": answer["removed"],
        # ReadWriteOnce sources: the tenant's Pod was stopped for the push (its next call starts one)
        "tenant_pods_stopped": answer["stopped"],
        # 2: the first push Pod's mount did not get the fsGroup (ReadWriteOnce; push.VolumeNotWritable)
        "push_pods": answer["attempts"],
    }
    if args.json:
        print_json(result)
    else:
        print_fields(list(result.items()))
    return 0
