"""The job supervisor: places queued jobs on GPUs and runs each one to its end (see
``supervisor.py``; each part is handed a :class:`~.context.JobContext`)."""
