"""Joining an experiment: the checks before it (:mod:`.doctor`), preparing the join (:mod:`.prepare`), the session
that trains (:mod:`.session`) and the metric reports it sends, spooled while the hub is away (:mod:`.reporter`,
:mod:`.spool`). May import the worker's client, training and swarm packages; never the server."""
