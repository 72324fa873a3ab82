# syntax=docker/dockerfile:1
# memfit operator image: slim Python with `memfit` and its operator extra (kopf, kubernetes client,
# prometheus-client), no torch. Runs as UID 65532 and works on a read-only root filesystem (the chart
# mounts an emptyDir on /tmp, which is also HOME).
# Build from the repository root:  docker build -t memfit/operator:0.1.0 .
# The real-node tier (docs/realnode.md) builds it here with a local base, passed as a build argument:
#   DOCKER_BUILDKIT=0 docker build --build-arg PYTHON_IMAGE=memfit-test/base:<hash> ...
# tests/e2e/test_images.py also runs the same install step on the same files without an engine.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# hadolint ignore=DL3006
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operator/ operator/
COPY trainer-image/memfit_trainer/ trainer-image/memfit_trainer/
COPY hack/image/install-operator.sh hack/image/install-operator.sh
RUN hack/image/install-operator.sh /opt/memfit /src

# hadolint ignore=DL3006
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="memfit-operator" \
      org.opencontainers.image.description="memfit Kubernetes operator: GPU training jobs that fit in memory at the lowest cost" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/memfit/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=build /opt/memfit /opt/memfit
# A passwd entry for the UID: kopf names its peering identity with getpass.getuser(), which raises
# KeyError for a UID without one (seen on the real node, docs/realnode.md).
RUN groupadd --gid 65532 memfit && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp memfit
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["memfit"]
CMD ["operator", "--metrics-port", "8080"]
