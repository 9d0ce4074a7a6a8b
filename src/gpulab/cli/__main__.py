"""``python -m gpulab.cli``: the ``gpulab`` command."""

from . import main

raise SystemExit(main())
