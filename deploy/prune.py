"""Remove from an image what the service never needs at run time.

Run by the Dockerfiles with the image's own Python (exec form, no shell needed):

    python prune.py venv /opt/venv     # build stage: installers, tests, caches out of the venv
    python prune.py runtime            # last step of the final stage: shells and tools out

Why the runtime step: the sandbox runs untrusted-input code paths. With no shell, no package
manager and no setuid binary, a compromised server has only the Python it already runs;
together with the read-only root fs and the `noexec` tmpfs there is nothing to drop in and run.
The files stay in a lower layer (a whiteout hides them), which is fine: the goal is that they
cannot be executed in a container, not secrecy.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

# Shells, package managers and tools that help an intruder more than the server.
RUNTIME_REMOVE = [
    "/bin/sh", "/bin/dash", "/bin/bash", "/bin/rbash", "/usr/bin/sh", "/usr/bin/dash",
    "/usr/bin/bash", "/usr/bin/rbash", "/bin/su", "/usr/bin/su",
    "/usr/bin/apt*", "/usr/bin/dpkg*", "/usr/bin/pip*", "/usr/local/bin/pip*",
    "/usr/bin/perl*", "/usr/bin/wget", "/usr/bin/curl", "/usr/bin/nc*", "/usr/bin/tar",
    "/usr/bin/find", "/usr/bin/xargs", "/usr/bin/chmod", "/usr/bin/chown", "/usr/bin/chgrp",
    "/usr/bin/mount", "/usr/bin/umount", "/usr/bin/setpriv", "/usr/bin/nsenter",
    "/usr/bin/unshare", "/usr/bin/ssh*", "/usr/sbin/sshd",
    "/usr/lib/python3*/ensurepip", "/usr/lib/python3/dist-packages/pip",
    "/usr/local/lib/python3*/ensurepip", "/usr/local/lib/python3*/site-packages/pip",
    "/usr/share/python-wheels",
]

VENV_REMOVE = [
    "bin/pip*", "bin/activate*", "bin/Activate.ps1",
    "lib/python3*/site-packages/pip", "lib/python3*/site-packages/pip-*.dist-info",
    "lib/python3*/site-packages/setuptools", "lib/python3*/site-packages/setuptools-*.dist-info",
    "lib/python3*/site-packages/pkg_resources", "lib/python3*/site-packages/_distutils_hack",
    "lib/python3*/site-packages/distutils-precedence.pth",
    "lib/python3*/site-packages/*/tests", "lib/python3*/site-packages/*/test",
]


def _remove(pattern: str) -> None:
    for path in glob.glob(pattern):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _strip_setid(root: str) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if mode & 0o6000 and not os.path.islink(path):
                os.chmod(path, mode & 0o1777)


def main(argv: list[str]) -> int:
    if argv[:1] == ["venv"] and len(argv) == 2:
        for pattern in VENV_REMOVE:
            _remove(os.path.join(argv[1], pattern))
        for folder, dirs, _files in os.walk(argv[1]):
            if "__pycache__" in dirs:  # stale caches from pip; compileall writes fresh ones
                shutil.rmtree(os.path.join(folder, "__pycache__"))
                dirs.remove("__pycache__")
        return 0
    if argv == ["runtime"]:
        for pattern in RUNTIME_REMOVE:
            _remove(pattern)
        for root in ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/lib", "/usr/libexec"):
            if os.path.isdir(root) and not os.path.islink(root):
                _strip_setid(root)
        os.unlink(__file__)
        return 0
    sys.stderr.write("usage: prune.py venv DIR | prune.py runtime\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
