# One image for every zmqflow service (broker, ps, worker, reader, serve, aggregator):
# the command picks the service (see docker-compose.yml and deploy/k8s/).
#   docker build -t zmqflow:latest .
# Stage 1 builds the wheel; stage 2 installs the locked core dependencies and that wheel, nothing else.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY zmqflow ./zmqflow
COPY common ./common
COPY models ./models
COPY inputs ./inputs
COPY services ./services
COPY jobs ./jobs
COPY cli ./cli
COPY bench ./bench
COPY loadtest ./loadtest
COPY data ./data
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache
COPY requirements/core.txt /tmp/core.txt
COPY --from=build /wheels /wheels
RUN pip install --require-hashes -r /tmp/core.txt \
    && pip install --no-deps /wheels/*.whl \
    && rm -rf /wheels /tmp/core.txt \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin zmqflow \
    && mkdir -p /data \
    && chown zmqflow:zmqflow /data

USER zmqflow
WORKDIR /home/zmqflow
VOLUME ["/data"]
EXPOSE 5555 5600 5601 5700 5701 5702 5800
CMD ["zmqflow", "--help"]
