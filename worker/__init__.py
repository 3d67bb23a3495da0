"""swarmhub's worker: what a volunteer installs to train with a swarm (from the hub it joins: ``GET /api/worker``
gives the pip command pinned to the hub's wheel).

Imported as ``swarmhub.worker``. It never imports the server, FastAPI or SQLAlchemy; the wire contract it shares
with the server is :mod:`swarmhub.common`.

- ``cli``: the ``swarmhub`` command and the commands other packages register.
- ``join``: what ``swarmhub join`` does: the checks, the join, the session and its metric reports.
- ``training``: one peer's hivemind training: the peer, its step loop, the averaging optimizer, LAMB.
- ``swarm``: swarm access, robust aggregation, state checks, the swarm's epoch, the witness records.
- ``service``: the worker as a background service within the volunteer's limits.
- ``tasks``: what is trained (model, data, loss), as plugins found by name, and the corpus they read.
- ``settings``, ``credentials``, ``client``, ``transport``, ``errors``: the typed ``SWARMHUB_*`` settings, the
  stored login, the HTTP API client, its transport and the documented exit codes.
"""
