"""swarmhub: train deep-learning models together on donated hardware.

The distribution has two halves, mapped from the repository's folders:

- ``swarmhub.common`` (``swarmhub/common/``): the wire contract and the swarm tokens both halves import.
- ``swarmhub.worker`` (``worker/``): what a volunteer installs. CLI, API client, tasks, the hivemind training
  loop and the metric reporter.
- ``swarmhub.server`` (``server/``, extra ``[server]``): the FastAPI app, database, pages and the
  per-experiment swarm peers.

``swarmhub.web`` holds templates and static assets; ``swarmhub.migrations`` the Alembic scripts.
"""

__version__ = "0.3.0"
