"""The engine layer: one vLLM engine per worker (``host``), an engine group of several frontends
on one EngineCore (``group``), the engine's arguments (``args``), the model it serves (``models``)
and its tokenizer as gateways read it (``encode``, ``tokenizer_files``).

The bottom of the worker: it imports nothing of the worker above it."""
