"""Every `DOCBROKER_*` variable anyone reads, so that one nobody reads stops the start.

A typo (`DOCBROKER_OIDC_ISSUR`) or a removed setting would otherwise be ignored in silence:
sign-in simply off, a limit at its default. The settings' own names come from reading a full
environment (every feature on, so every variable is read); the others are read by other entry
points or by scripts that start brokers, each listed with where it is read."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping

from broker.settings.reader import PREFIX, SettingRead, SettingsError

# Read outside the settings, and so set in environments that start a broker.
OTHER_VARIABLES: dict[str, str] = {
    "DOCBROKER_TOKEN": "broker/cli/client_config.py",  # the clients' token placeholder, in a user's shell
    "DOCBROKER_VENV": "dev, deploy/demo.sh",  # the virtual environment the scripts run the broker from
    "DOCBROKER_PG_USER": "tests/broker/pgtest.py, .ci/postgres.sh",  # the test database's role
    "DOCBROKER_RELIABILITY_OUT": "tests/reliability",  # where a reliability run writes its summary
    "DOCBROKER_RELIABILITY_KEEP": "tests/reliability",  # a folder keeping a run's files to study
    "DOCBROKER_ROOTLESS_USER": ".ci/docker.sh",  # the rootless daemon's user
    "DOCBROKER_SKIP_ROOTLESS": ".ci/docker.sh",  # rootful daemon only
    "DOCBROKER_CHECKOV_DIR": "tests/k8s_manifests/install-checkov.sh",  # checkov's cache
    "DOCBROKER_KUBE_LAB_CACHE": ".ci/kube-lab.sh",  # the Kubernetes lab's cache
    "DOCBROKER_KUBELET_KEEP_SYSCTLS": ".ci/kube-lab/kubelet-kernel-tunables.sh",  # the lab's kubelet
    "DOCBROKER_OIDC_PROVIDER_DIR": ".ci/oidc-provider.sh",  # the test OpenID Provider's cache
    # The lab overlay's broker Pod: parts of its DOCBROKER_DATABASE_URL (k8s/overlays/lab).
    "DOCBROKER_LAB_POSTGRES_HOST": "k8s/overlays/lab/broker-lab.yaml",
    "DOCBROKER_LAB_POSTGRES_PORT": "k8s/overlays/lab/broker-lab.yaml",
    "DOCBROKER_LAB_POSTGRES_DB": "k8s/overlays/lab/broker-lab.yaml",
}
# The test harness's own (`./dev test`, .ci/): never the broker's.
HARNESS_PREFIX = "DOCBROKER_TEST_"


def refuse_unknown(env: Mapping[str, str], known: Callable[[], list[SettingRead]]) -> None:
    """One line naming the first variable nobody reads, and the closest known setting."""
    given = sorted(name for name in env if name.startswith(PREFIX) and not name.startswith(HARNESS_PREFIX))
    if not given:
        return
    names = {read.name for read in known()} | set(OTHER_VARIABLES)
    for name in given:
        if name in names:
            continue
        # Without the prefix every name shares: else any two names look alike.
        short = sorted(n.removeprefix(PREFIX) for n in names)
        close = difflib.get_close_matches(name.removeprefix(PREFIX), short, n=1, cutoff=0.6)
        hint = f": did you mean {PREFIX}{close[0]}?" if close else " (docs/operations.md lists the settings)"
        raise SettingsError(f"{name} is not a setting{hint}")
