# cpbench image: the package and its CLI (`cpbench serve`, `cpbench worker`, `cpbench db upgrade`, ...).
#
# CPU by default (python:3.11-slim, PyTorch's CPU wheel, PostgreSQL driver):
#   docker build -t cpbench .
# GPU worker (a CUDA base, PyTorch's CUDA wheel, Triton); docker-compose.yml builds this one for `worker`:
#   docker build -t cpbench-gpu \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#     --build-arg EXTRAS=gpu,postgres .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# extras of pyproject.toml to install: "postgres" (API, CPU worker) or "gpu,postgres" (Triton, GPU worker)
ARG EXTRAS=postgres
# where PyTorch comes from: the CPU wheel index keeps the slim image free of CUDA libraries
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    CPBENCH_ARTIFACT_DIR=/data/artifacts \
    NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1

# CUDA bases have no Python; Triton compiles its launcher stubs at run time, so it needs a C compiler and Python.h
RUN set -eux; \
    pkgs=""; \
    command -v python3 >/dev/null || pkgs="$pkgs python3 python3-venv python3-pip"; \
    case ",${EXTRAS}," in *,gpu,*) pkgs="$pkgs gcc libc6-dev python3-dev";; esac; \
    if [ -n "$pkgs" ]; then \
      apt-get update; apt-get install -y --no-install-recommends $pkgs; rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv "$VIRTUAL_ENV"; \
    pip install --upgrade pip setuptools wheel; \
    pip install --index-url "$TORCH_INDEX_URL" torch

WORKDIR /app
COPY pyproject.toml README.md ./
COPY kernels ./kernels
COPY runners ./runners
COPY db ./db
COPY bench_server ./bench_server
COPY dashboards ./dashboards
COPY suites ./suites
RUN pip install ".[${EXTRAS}]" && cpbench --help >/dev/null

RUN useradd --create-home cpbench && mkdir -p /data/artifacts && chown -R cpbench /data
USER cpbench
VOLUME ["/data/artifacts"]
EXPOSE 8000
# the API's healthcheck (GET /healthz) is in docker-compose.yml: the same image also runs workers, which serve nothing
CMD ["cpbench", "serve", "--host", "0.0.0.0", "--port", "8000"]
