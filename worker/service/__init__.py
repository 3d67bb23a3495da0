"""The worker as a background service: the volunteer's limits (:mod:`.limits`), the supervisor that runs and
restarts the worker (:mod:`.runner`), its state file (:mod:`.state`) and the systemd/launchd units (:mod:`.units`)."""
