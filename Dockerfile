# syntax=docker/dockerfile:1
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 app
WORKDIR /app

# Dependencies first, in their own layer: code changes do not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p agent steps sandbox && touch agent/__init__.py steps/__init__.py sandbox/__init__.py \
    && pip install . && pip uninstall -y refund-agent

COPY agent ./agent
COPY steps ./steps
COPY sandbox ./sandbox
COPY dbos-config.yaml ./
RUN pip install --no-deps . && mkdir -p /app/.refund-agent && chown app:app /app/.refund-agent

USER app
ENV REFUND_AGENT_DATA_DIR=/app/.refund-agent
# Workers are stopped with SIGTERM and finish the step in flight; the rest is recovered on restart.
STOPSIGNAL SIGTERM
CMD ["refund-agent", "worker"]
