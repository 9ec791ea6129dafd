"""The HTTP adapter: aiohttp application, admission endpoints, health and metrics."""
