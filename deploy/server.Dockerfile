# The document-tools server: one tenant's sandbox (DESIGN §7).
#
#   docbroker image build server                 # preferred: builds base + wheelhouse + this
#   docker build -f server.Dockerfile --build-arg BASE=python:3.11-slim CONTEXT
#
# The build context is a small temporary folder made by broker/images.py: this file,
# prune.py, bytecode.py, requirements.txt (requirements/server.txt: the lock's `server` group,
# hashed), wheelhouse/ and server/. Nothing is fetched from the network during the build
# (containers on these hosts cannot reach PyPI; air-gapped users neither): every dependency
# comes from the wheelhouse built on the host, and pip installs a wheel only if its sha256 is
# the one in the lock (--require-hashes): a swapped or altered wheel fails the build.
ARG BASE=docbroker-base:bookworm

FROM ${BASE} AS build
COPY wheelhouse/ /wheelhouse/
COPY requirements.txt prune.py umask.pth /build/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --require-hashes --no-index --find-links /wheelhouse \
        --no-compile --disable-pip-version-check -q -r /build/requirements.txt \
 && /opt/venv/bin/python /build/prune.py venv /opt/venv
COPY server/ /build/server/
# The server package goes into the venv's site-packages: `python -m server` then works from
# any working directory and needs no PYTHONPATH.
RUN site="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cp -r /build/server "$site/server" \
 && cp /build/umask.pth "$site/docbroker-umask.pth" \
 && find "$site/server" -name __pycache__ -prune -exec rm -rf {} + \
 && /opt/venv/bin/python -m compileall -q -j 0 -o 2 --invalidation-mode unchecked-hash /opt/venv >/dev/null \
 && chmod -R a+rX /opt/venv
# a+rX: the venv's python runs umask.pth (007), so the caches it just wrote are root's group's
# only; the sandbox runs in a group of its own on a rootful daemon (and must read them).
# unchecked-hash: the root fs is read-only and never changes, so Python need not stat sources
# to validate its caches, and it can never try (and fail) to write new ones. Level 2 only:
# the server runs with -OO (see ENTRYPOINT); anything else run in the image reads the sources.

FROM ${BASE}
COPY --from=build /opt/venv /opt/venv
COPY prune.py bytecode.py /
RUN ["/opt/venv/bin/python", "/prune.py", "runtime"]
RUN ["/opt/venv/bin/python", "-B", "-OO", "/bytecode.py"]
# uid 10001 in a group of its own: never gid 0, which on a rootful daemon is the host's root
# group. The broker always sets the user itself (broker/runtime/docker/hardening.py `sandbox_user`): this
# line on a rootful daemon, 10001:0 on a rootless one, where container gid 0 is the broker
# user's own gid, so the broker reads reports (mode 0o040, group read) that the sandbox, their
# owner, cannot read back (seccomp forbids chmod).
USER 10001:10001
WORKDIR /
ENV PATH=/opt/venv/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    DOCS_ROOT=/srv/docs \
    DOCS_SECRET_FILE=/run/secrets/approval.key
# -OO: no docstrings or asserts in memory, ~2.5 MiB less per idle sandbox. The tools' published
# schemas do not depend on docstrings (tests/server/test_contracts_optimized.py checks it).
ENTRYPOINT ["/opt/venv/bin/python", "-OO", "-m", "server", "--socket", "/run/docs/mcp.sock"]
