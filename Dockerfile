# syntax=docker/dockerfile:1
# One image for every role: `refund-agent serve --no-worker` (API), `refund-agent worker`, `refund-agent migrate`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    REFUND_AGENT_DATA_DIR=/app/.refund-agent \
    REFUND_AGENT_HOST=0.0.0.0 \
    REFUND_AGENT_PORT=8000 \
    REFUND_AGENT_LOG_FORMAT=json

RUN groupadd --gid 10001 app && useradd --create-home --uid 10001 --gid 10001 app
WORKDIR /app

# Dependencies first, in their own layer: a code change does not reinstall them. The packages are
# stubbed so `pip install .` resolves the project's dependencies, then the stub project is removed.
COPY pyproject.toml README.md ./
RUN mkdir -p agent steps sandbox \
    && touch agent/__init__.py steps/__init__.py sandbox/__init__.py \
    && pip install --no-cache-dir . \
    && pip uninstall -y refund-agent \
    && rm -rf agent steps sandbox build

COPY agent ./agent
COPY steps ./steps
COPY sandbox ./sandbox
COPY dbos-config.yaml ./
RUN pip install --no-cache-dir --no-deps . \
    && rm -rf build \
    && mkdir -p /app/.refund-agent \
    && chown 10001:10001 /app/.refund-agent

USER 10001:10001
EXPOSE 8000
# /healthz answers once the API is up. Workers have no API: with REFUND_AGENT_METRICS_PORT=8000 their metrics
# server answers the same probe (compose.yaml does this).
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; sys.exit(urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('REFUND_AGENT_PORT', '8000')}/healthz\", timeout=2).status != 200)"]
# SIGTERM: stop taking refunds, let the ones in flight finish (SHUTDOWN_TIMEOUT_SECONDS), release the
# executor lease; what is left is recovered by the next start or by the surviving workers.
STOPSIGNAL SIGTERM
CMD ["refund-agent", "serve"]
