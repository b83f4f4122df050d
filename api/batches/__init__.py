"""OpenAI's Batch API, online: files (api/batches/files.py), batches (service.py), the runner that
turns a batch's lines into ordinary jobs and gathers their results (runner.py, lines.py)."""
