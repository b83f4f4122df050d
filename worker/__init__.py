"""inferq's GPU worker: a Celery worker holding one vLLM AsyncLLM engine."""
