"""swarmhub's worker: what a volunteer installs (``pip install swarmhub``) to train with a swarm.

Imported as ``swarmhub.worker``. It never imports the server, FastAPI or SQLAlchemy.

- ``protocol``: the wire contract (join request/response, experiment config, metric messages), shared with
  the server; pydantic only.
- ``settings``: ``WorkerSettings``, the ``SWARMHUB_*`` environment as one typed object, built by the CLI.
- ``credentials``: the stored login (``credentials.json``, mode 0600) and the env overrides.
- ``client``: ``ApiClient`` for the server's HTTP API; ``WorkerError`` and the documented exit codes.
- ``reporter``: ``Reporter``, metric messages over a reconnecting websocket (bounded, acked, never blocks).
- ``training``: ``train()``, the hivemind training loop (DHT + ``hivemind.Optimizer``), with clean shutdown.
- ``tasks``: what is trained (model, data, loss), as plugins found by name.
- ``cli``: the ``swarmhub`` command (login, whoami, logout, experiments, join; server wrappers).
"""
