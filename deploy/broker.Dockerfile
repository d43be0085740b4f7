# The broker: the docbroker package (server + broker) on the same base.
#
# Build context (made by broker/images.py): this file, prune.py, wheelhouse/ (holding the
# docbroker wheel and all its dependencies), requirements.txt and policies/. requirements.txt is
# requirements/broker.txt (the lock's hashed export) plus the docbroker wheel's own sha256, taken
# when the context is made: pip installs nothing whose hash is not listed (--require-hashes).
# Run it with the (rootless) Docker socket mounted and DOCBROKER_* settings; see README.
ARG BASE=docbroker-base:bookworm

FROM ${BASE} AS build
COPY wheelhouse/ /wheelhouse/
COPY requirements.txt prune.py /build/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --require-hashes --no-index --find-links /wheelhouse \
        --no-compile --disable-pip-version-check -q -r /build/requirements.txt \
 && /opt/venv/bin/python /build/prune.py venv /opt/venv \
 && /opt/venv/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/venv >/dev/null

FROM ${BASE}
COPY --from=build /opt/venv /opt/venv
COPY policies/ /opt/docbroker/policies/
COPY prune.py /prune.py
RUN ["/opt/venv/bin/python", "/prune.py", "runtime"]
USER 10001:0
WORKDIR /opt/docbroker
ENV PATH=/opt/venv/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DOCBROKER_POLICIES_DIR=/opt/docbroker/policies \
    DOCBROKER_DOCKER_SECCOMP_PROFILE=/opt/docbroker/policies/seccomp.json \
    DOCBROKER_DATA_DIR=/var/lib/docbroker \
    DOCBROKER_HOST=0.0.0.0
EXPOSE 8080
ENTRYPOINT ["/opt/venv/bin/docbroker"]
CMD ["serve"]
