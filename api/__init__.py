"""inferq gateway: a stateless FastAPI app that validates, enqueues and streams jobs."""
