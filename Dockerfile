# One image for gateway and workers. ENGINE=gpu installs vLLM (CUDA); ENGINE=cpu the CPU build.
FROM python:3.11-slim
ARG ENGINE=gpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api ./api
COPY worker ./worker
COPY shared ./shared
COPY cli ./cli
# Each step fails the build on its own: a failed install never yields a green image.
RUN pip install ".[${ENGINE},tracing]"
# PyPI's torchvision/torchaudio/torchcodec do not match vLLM's torch (pip skips those not installed)
RUN pip uninstall -y torchvision torchaudio torchcodec
RUN python -c "import inferq.api.app, inferq.worker.tasks" && inferq --help >/dev/null
EXPOSE 8000 9400
CMD ["inferq", "api", "--host", "0.0.0.0", "--port", "8000"]
