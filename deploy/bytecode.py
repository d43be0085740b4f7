"""Write optimised (-OO) bytecode for the standard library modules the sandbox server loads.

    python -B -OO bytecode.py      # the server image's final stage, as root, before USER

The server runs with -OO: no docstrings and no asserts in memory, ~2.5 MiB less resident
memory in every sandbox (bench/README.md). Its root fs is read-only, so a module without an
opt-2 cache written at build time would be compiled from source on every start. The venv is
compiled at opt-2 by compileall; the standard library's caches come from the base image at
opt-0 only. This imports every module of the `server` package, then writes opt-2 caches for
each standard library package (whole: a package imports its own modules lazily) and single
module it loaded: about 4 MB, against ~11 MB for the whole standard library.
"""

from __future__ import annotations

import compileall
import importlib
import os
import pkgutil
import py_compile
import re
import sys
import sysconfig

_TESTS = re.compile(r"[/\\]tests?[/\\]")  # a package's own tests: never loaded, may not compile


def _load_server() -> None:
    import server

    importlib.import_module("server.__main__")
    for info in pkgutil.walk_packages(server.__path__, "server."):
        importlib.import_module(info.name)


def _stdlib_sources(stdlib: str) -> tuple[set[str], set[str]]:
    """(package folders, single module files) of the standard library that are loaded now."""
    packages: set[str] = set()
    modules: set[str] = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        # The path as imported, not resolved: the cache sits beside it (Debian's sitecustomize
        # is a symlink into /etc, and Python looks for its cache under the stdlib's folder).
        if not path.startswith(stdlib + os.sep) or os.sep + "site-packages" + os.sep in path:
            continue
        top = os.path.relpath(path, stdlib).split(os.sep)[0]
        if top.endswith(".py"):
            modules.add(path)
        else:
            packages.add(os.path.join(stdlib, top))
    return packages, modules


def main() -> int:
    if sys.flags.optimize != 2 or not sys.flags.dont_write_bytecode:
        sys.stderr.write("bytecode.py: run it as python -B -OO (the server's own flags)\n")
        return 2
    # Caches every user may read: the image's umask.pth (007, for the server's socket) would
    # leave them to root's group, and the sandbox is not in it on a rootful daemon.
    os.umask(0o022)
    _load_server()
    stdlib = sysconfig.get_paths()["stdlib"]
    packages, modules = _stdlib_sources(stdlib)
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH  # the root fs never changes
    # quiet=1: only errors are printed; a file that does not compile fails the image build.
    ok = True
    for folder in sorted(packages):
        ok &= bool(
            compileall.compile_dir(folder, quiet=1, rx=_TESTS, optimize=2, invalidation_mode=mode, workers=0)
        )
    for path in sorted(modules):
        ok &= bool(compileall.compile_file(path, quiet=1, optimize=2, invalidation_mode=mode))
    print(f"bytecode.py: opt-2 caches for {len(packages)} packages and {len(modules)} modules")
    os.unlink(__file__)  # a build step, like prune.py: it leaves nothing behind in the image
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
