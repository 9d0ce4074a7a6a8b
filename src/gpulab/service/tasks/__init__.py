"""What the service does on its own, periodically, through the hub's REST API like a user:
stop notebooks past their maximum run time (``watchdog.py``) or idle (``idle.py``)."""
