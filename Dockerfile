# One image for gateway and workers. ENGINE=gpu installs vLLM (CUDA); ENGINE=cpu the CPU build.
FROM python:3.11-slim
ARG ENGINE=gpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api ./api
COPY worker ./worker
COPY shared ./shared
RUN pip install ".[${ENGINE}]" && pip uninstall -y torchvision torchaudio torchcodec || true
EXPOSE 8000
CMD ["inferq", "api", "--host", "0.0.0.0", "--port", "8000"]
