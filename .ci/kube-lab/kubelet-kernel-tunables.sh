#!/usr/bin/env bash
# Makes the kubelet only warn about kernel tunables when DOCBROKER_KUBELET_KEEP_SYSCTLS is set:
# it otherwise writes kernel.panic, kernel.panic_on_oops and vm.overcommit_memory, and the CI
# machine is not ours to retune. Applied to a fresh source tree by kube-lab.sh build.
set -euo pipefail
f=${1:?source tree}/pkg/kubelet/cm/container_manager_linux.go
grep -q DOCBROKER_KUBELET_KEEP_SYSCTLS "$f" && exit 0
python3 - "$f" <<'PY'
import sys

path = sys.argv[1]
src = open(path).read()
anchor = "\tif err := setupKernelTunables(b); err != nil {"
assert src.count(anchor) == 1, "kubelet: the kernel-tunable call was not found"
guard = (
    '\tif os.Getenv("DOCBROKER_KUBELET_KEEP_SYSCTLS") != "" {\n'
    "\t\tb = KernelTunableWarn\n"
    "\t}\n"
)
open(path, "w").write(src.replace(anchor, guard + anchor, 1))
PY
grep -q DOCBROKER_KUBELET_KEEP_SYSCTLS "$f"
