"""Where JupyterHub's entry point ``gpulab`` finds the spawner (until pyproject.toml names
:mod:`gpulab.notebooks.spawner`)."""

from .notebooks.spawner import NotebookSpawner, SpawnFailed, __version__

__all__ = ["NotebookSpawner", "SpawnFailed", "__version__"]
