# syntax=docker/dockerfile:1
# nsqworker base image: `nsqworker` as the entrypoint, run as PID 1.
#
#   docker build -t nsqworker .
#   docker run --rm nsqworker run myservice.tasks     (with myservice on PYTHONPATH)
#
#   docker build --secret id=ca,src=ca-bundle.pem -t nsqworker .   (behind a TLS-intercepting proxy)
#   make image     (podman on a local Debian base, where no registry can be reached)
#
# A service builds its own image FROM this one: examples/docker/Dockerfile.
#
# PID 1 is the nsqworker supervisor itself, not an init: it installs handlers for
# SIGTERM and SIGINT (so the kernel's PID-1 rule of ignoring signals without a
# handler does not bite), drains its worker processes on SIGTERM, and waits for
# every worker it starts. Kubernetes' SIGTERM thus starts the drain directly.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---------------------------------------------------------------- build
FROM ${PYTHON_IMAGE} AS build
ARG UV_VERSION=0.13.9
# uv: install what uv.lock pins (--frozen: no resolution), bytecode compiled now
# because the runtime root filesystem is read-only, copies instead of links.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/nsqworker \
    UV_NO_CACHE=1
# Behind a TLS-intercepting proxy, give its CA bundle as a build secret: it is mounted
# for these steps only and never stored in a layer (docs/kubernetes.md):
#   docker build --secret id=ca,src=/path/to/ca-bundle.pem .
# Without the secret the default trust store is used.
RUN --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src
# dependencies first: this layer is reused until the lock changes
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi \
    && uv sync --frozen --no-dev --no-install-project --no-editable --extra uvloop --extra kubernetes --extra console --extra nats --extra rabbitmq
COPY nsqworker ./nsqworker
RUN --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi \
    && uv sync --frozen --no-dev --no-editable --extra uvloop --extra kubernetes --extra console --extra nats --extra rabbitmq

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
# nsqworker binds health to 127.0.0.1 by default; in a container that is unreachable
# from outside it, so the image binds every address (as the Helm chart does).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/nsqworker/bin:$PATH \
    PYTHONPATH=/app \
    NSQWORKER_HEALTH_HOST=0.0.0.0
RUN groupadd --gid 10001 nsqworker \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /app --shell /usr/sbin/nologin nsqworker
COPY --from=build /opt/nsqworker /opt/nsqworker
WORKDIR /app
USER 10001:10001
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["nsqworker"]
CMD ["--help"]
