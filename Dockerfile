# One image for every zmqflow service: `zmqflow` is the entrypoint, the command picks the service.
#   docker build -t zmqflow:latest -t zmqflow:0.2.0 .                     # deploy/k8s names the version tag
#   docker run --rm zmqflow:latest broker --bind tcp://0.0.0.0:5555      # or: ps, worker, serve, ...
# Stage 1 builds the project's wheel; stage 2 installs the locked dependencies with the http and grpc extras
# (requirements/serve.txt: core.txt's plus the gateway's, HTTP and gRPC, hashes checked) and that wheel into
# python:3.11-slim, nothing else:
# no compiler, no source tree, no tests. Bring your own model code and data by mounting them
# (docker-compose.yml mounts ZMQFLOW_USER_DIR at /user, on PYTHONPATH) or by building FROM this
# image (deploy/README.md).
# The base image is this build argument: a fixed version tag, never `latest`. Pin it by digest where the
# registry is reachable: --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest> (docs/security.md).
# checkov:skip=CKV_DOCKER_7:FROM names the build argument PYTHON_IMAGE (python:3.11-slim), which checkov does not expand
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
# The version the labels carry; the build fails when it is not the wheel's (zmqflow/__init__.py).
ARG ZMQFLOW_VERSION=0.2.0
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && test -f "/wheels/zmqflow-${ZMQFLOW_VERSION}-py3-none-any.whl" \
    || { echo "the wheel is not zmqflow ${ZMQFLOW_VERSION}: set ZMQFLOW_VERSION to common/version.py's __version__"; ls /wheels; exit 1; }

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    ZMQFLOW_HEALTH_FILE=/tmp/zmqflow-health
# The dependencies first, in a layer of their own: a change to the code rebuilds only the wheel's.
COPY requirements/serve.txt /tmp/requirements.txt
RUN pip install --require-hashes -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin zmqflow \
    && mkdir -p /data /user /keys \
    && chown zmqflow:zmqflow /data /keys
COPY --from=build /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels

ARG ZMQFLOW_VERSION=0.2.0
ARG VCS_REF=unknown
LABEL org.opencontainers.image.title="zmqflow" \
      org.opencontainers.image.description="TensorFlow 1.x style distributed training and ensemble serving as services over ZeroMQ" \
      org.opencontainers.image.version="${ZMQFLOW_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER zmqflow
WORKDIR /home/zmqflow
VOLUME ["/data"]
# Services announce their endpoint in $ZMQFLOW_HEALTH_FILE once they listen (workers and readers
# say `client`); compose and Kubernetes may set a check of their own per service.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["zmqflow", "healthcheck"]
ENTRYPOINT ["zmqflow"]
CMD ["--help"]
