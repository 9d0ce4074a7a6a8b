"""A workload's data: what the sync helper is told (:mod:`.helper`, pure) and the pull, push
and purge of a workload's volumes with it, through the ``Runtime`` (:mod:`.sync`)."""
