# sluicegate's image: `docker build -t registry.example.com/sluicegate:0.1.0 .`
# Stage 1 builds the wheel, compiling the scheduler's core with mypyc (setup.py); stage 2
# installs it, and its dependencies' wheels, into a slim runtime that runs as a non-root user.
# Needs BuildKit (the default builder since Docker 23) for RUN --mount.

FROM python:3.11-slim AS build
# A C compiler for mypyc (Python.h ships with the image).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# SLUICEGATE_COMPILE=1: fail the build rather than ship a plain-Python core.
RUN SLUICEGATE_COMPILE=1 python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels sluicegate \
    && python -c "import sluicegate.core.scheduler as s; assert s.__file__.endswith('.so'), s.__file__"
# Numeric, so that Kubernetes' runAsNonRoot can verify it (deploy/k8s runs it as 10001).
RUN groupadd --gid 10001 sluicegate \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sluicegate
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["sluicegate"]
CMD ["serve", "--config", "/etc/sluicegate/sluicegate.yaml"]
