"""Serving what was rendered: the aiohttp server (``/metrics`` sends cached bytes, nothing is
computed per scrape), the landing page, the listening sockets with their connection limits and
TLS, the exporter-toolkit web config (``webconfig/``: TLS, basic auth, reload on change), and the
container health check."""
