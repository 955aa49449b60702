# syntax=docker/dockerfile:1
# Two images, both multi-arch (amd64, arm64: Jetson Thor is arm64), on Debian bookworm alone:
#   docker buildx build --platform linux/amd64,linux/arm64 --target runtime  -t flashrt-runtime .
#   docker buildx build --platform linux/amd64,linux/arm64 --target operator -t flashrt-operator .
# `make images` builds both for both with buildah, no Docker engine or registry, on a base it
# bootstraps from the Debian archive (deploy/build_images.py); DEBIAN names that base.
ARG DEBIAN=debian:bookworm-slim

# The bundle and the wheel are pure Python, the same for every platform: buildx builds them once,
# on the builder's own (buildah 1.28 builds them for each).
FROM --platform=$BUILDPLATFORM ${DEBIAN} AS build
# Debian's security archive replaces a version when it patches it: pinned versions would stop
# the rebuild that takes the fix.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY kernels ./kernels
COPY runtime ./runtime
COPY operator ./operator
COPY bench ./bench
RUN /venv/bin/pip install --no-cache-dir --no-deps . \
    && /venv/bin/flashrt bundle /bundle \
    && /venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# A static busybox, Debian's, for the runtime image's one command.
FROM ${DEBIAN} AS busybox
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends busybox-static \
    && rm -rf /var/lib/apt/lists/*

# The runtime bundle: pure Python (torch and Triton come from the vLLM image it is copied into).
# Its one command copies the bundle into the folder it is given: the emptyDir the webhook mounts
# at /opt/flashrt and passes as the init container's argument.
FROM scratch AS runtime
COPY --from=busybox /bin/busybox /bin/busybox
COPY --from=build /bundle /bundle
USER 65532:65532
ENTRYPOINT ["/bin/busybox", "cp", "-R", "/bundle/."]
CMD ["/opt/flashrt"]

# The operator: flashrt[operator] (kopf, no torch) in a virtual environment on Debian's Python,
# non-root, no compilers: every dependency installs from a binary wheel on amd64 and arm64.
FROM ${DEBIAN} AS operator
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN python3 -m venv /opt/flashrt \
    && /opt/flashrt/bin/pip install --no-cache-dir --only-binary=:all: "$(ls /wheels/flashrt-*.whl)[operator]" \
    && rm -rf /wheels
ENV PATH=/opt/flashrt/bin:$PATH
USER 65532:65532
ENTRYPOINT ["kopf"]
