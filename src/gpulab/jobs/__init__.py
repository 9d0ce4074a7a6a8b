"""The jobs domain: a training job from its submission to its end.

- :mod:`.spec`: a submission parsed into a ``JobSpec`` or refused, and its JSON Schema (pure);
- :mod:`.scheduler`: who starts where, who is preempted (pure); :mod:`.recovery`: what to do
  with a job after a restart or a fault (pure); :mod:`.gang`: a distributed job's ranks and
  what each one is told (pure); :mod:`.logs`: a job's ranks' logs merged (pure);
- :mod:`.states`, :mod:`.records`, :mod:`.usage`: the state families, the job records in the
  database (compare-and-set transitions, history) and the billed minutes read from them;
- :mod:`.actions`: what a user may ask (submit, interrupt, resume, rerun, retry a push,
  delete), the one function each adapter calls;
- :mod:`.supervisor`: the service's job supervisor (placement on GPUs, each job run to its
  end through the ``Runtime``, recovery after a restart, housekeeping).
"""
