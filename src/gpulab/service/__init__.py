"""The gpulab service, run by the hub as a managed service: the REST API (``api/``), the web
pages (``pages/``), what every handler shares (``base.py``), the periodic stops through the
hub (``tasks/``), the app and its route tables (``app.py``), and the process that runs them
with the job supervisor (``__main__.py``)."""
