"""``gpulab admin``: an operator's commands on the hub's host, beside the hub's configuration.

``python -m gpulab.admin backup DEST`` takes a consistent copy of both databases while
everything runs (the hub's ``JupyterHub.db_url`` and gpulab's ``database_url``: SQLite through
its online backup API, PostgreSQL with ``pg_dump``) and writes a manifest; ``restore SRC
DATA_DIR`` puts one back into a fresh data directory (:mod:`.backup`); ``upgrade-db`` runs the
schema revisions gpulab's database lacks (:func:`gpulab.db.upgrade_database`). ``gpulab admin ...``
runs this program, as ``gpulab doctor`` runs :mod:`gpulab.doctor`. See docs/upgrading.md.
"""
