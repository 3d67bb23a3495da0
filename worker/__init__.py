"""swarmhub's worker: what a volunteer installs to train with a swarm (from the hub it joins: ``GET /api/worker``
gives the pip command pinned to the hub's wheel).

Imported as ``swarmhub.worker``. It never imports the server, FastAPI or SQLAlchemy.

- ``protocol``: the wire contract (join request/response, experiment config, metric messages), shared with
  the server; pydantic only.
- ``settings``: ``WorkerSettings``, the ``SWARMHUB_*`` environment as one typed object, built by the CLI.
- ``credentials``: the stored login (``credentials.json``, mode 0600) and the env overrides.
- ``client``: ``ApiClient`` for the server's HTTP API; ``WorkerError`` and the documented exit codes.
- ``reporter``: ``Reporter``, metric messages over a reconnecting websocket (bounded, acked, never blocks).
- ``training``: ``train()``, the hivemind training loop (DHT + ``hivemind.Optimizer``), with clean shutdown;
  ``training_loop`` holds the loops it runs in the swarm, ``peer_access`` the peer's admission (token, roster).
- ``tasks``: what is trained (model, data, loss), as plugins found by name.
- ``cli``: the ``swarmhub`` command (login, whoami, logout, experiments, join; server wrappers), ``commands``
  what its commands share (errors as one line, settings, the API client); ``login`` the
  browser login, ``joining`` what ``join`` does before the session, ``session`` the session runner.
- the background worker: ``service_cli`` the ``service`` and ``run-service`` commands, ``service_units`` the
  systemd unit and launchd plist, ``runner`` the loop that supervises ``join`` within the limits, ``limits`` the
  volunteer's ``config.toml`` and the checks behind it (hours, battery, other programs' CPU load).
"""
