# One image for every zmqflow service (broker, ps, worker, reader, serve, aggregator):
# the command picks the service (see docker-compose.yml and deploy/k8s/).
#   docker build -t zmqflow:latest .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache

WORKDIR /app
# The source stays in /app (an editable install) so that data/ ships next to common/,
# where the MNIST presets and the chief's evaluation find it.
COPY pyproject.toml README.md ./
COPY common ./common
COPY services ./services
COPY bench ./bench
COPY data ./data
RUN pip install -e . \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin zmqflow \
    && mkdir -p /data \
    && chown zmqflow:zmqflow /data

USER zmqflow
VOLUME ["/data"]
EXPOSE 5555 5600 5601 5700 5701 5702 5800
CMD ["zmqflow", "--help"]
