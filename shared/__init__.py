"""Code shared by inferq's gateway and workers: wire schemas, Redis layout, settings, errors."""
