"""The Kubernetes API adapter: a small async client and a reflector (list, then watch)."""
