# syntax=docker/dockerfile:1
# Two images, both multi-arch (amd64, arm64: Jetson Thor is arm64):
#   docker buildx build --platform linux/amd64,linux/arm64 --target runtime  -t flashrt-runtime .
#   docker buildx build --platform linux/amd64,linux/arm64 --target operator -t flashrt-operator .

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY kernels ./kernels
COPY runtime ./runtime
COPY operator ./operator
COPY bench ./bench
RUN pip install --no-cache-dir --no-deps . \
    && flashrt bundle /bundle \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# The runtime bundle: pure Python (torch and Triton come from the vLLM image it is copied into).
# Its entrypoint copies the bundle into the emptyDir the webhook mounts at the given path.
FROM busybox:1.37 AS runtime
COPY --from=build /bundle /bundle
USER 65532:65532
ENTRYPOINT ["/bin/sh", "-c", "cp -R /bundle/. \"$0\"", "/opt/flashrt"]

# The operator: flashrt[operator] (kopf, no torch), non-root, no compilers.
FROM python:3.12-slim AS operator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/flashrt-*.whl)[operator]" && rm -rf /wheels
USER 65532:65532
ENTRYPOINT ["kopf"]
