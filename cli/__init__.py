"""The ``inferq`` command: the one part that knows the gateway, the worker and the clients."""
