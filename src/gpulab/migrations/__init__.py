"""gpulab's schema revisions (Alembic), for its own tables only: JupyterHub's database is
JupyterHub's (``jupyterhub upgrade-db``).

``versions/`` holds one file per revision, each a frozen step (it never imports the models).
:func:`gpulab.db.prepare_schema` applies them: a new database is made from the models and
stamped with the newest revision; an older one is refused at start-up until
``gpulab admin upgrade-db`` runs them (as JupyterHub does). A new revision:
``alembic -c src/gpulab/migrations/alembic.ini revision --autogenerate -m WHAT`` against a
database at the newest revision (``GPULAB_DATABASE_URL``), read and edit what it wrote, then
add the previous schema's fixture test (tests/unit/test_migrations.py). See docs/upgrading.md.
"""
