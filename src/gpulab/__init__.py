"""gpulab: self-hosted GPU notebooks and training jobs on JupyterHub."""

__version__ = "0.1.0"
