# syntax=docker/dockerfile:1
# The reservation webhook image: `webhook` as entrypoint, run as 65532:65532 with a read-only
# root filesystem (deploy/base/deployment.yaml).

# Builder: wheels for the project and every dependency. All dependencies publish manylinux
# wheels, so nothing is compiled here either.
FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook ./webhook
RUN pip wheel --no-deps -w /wheels . \
 && pip wheel -w /wheels /wheels/cozystack_reservation_webhook-*.whl

# Final: the wheels installed, and nothing else from the builder. The wheels are bind-mounted
# for the install only, so they add no layer; no pip cache is written.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels cozystack-reservation-webhook
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["webhook"]
