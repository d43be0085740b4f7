"""The Kubernetes runtime: one Pod per tenant (backend), its spec, `doctor` and `tenant manifest`."""

from broker.runtime.kubernetes.backend import KubeReplicas, KubernetesBackend

__all__ = ["KubeReplicas", "KubernetesBackend"]
