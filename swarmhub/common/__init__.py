"""The contract both sides speak, light enough for any process: the wire messages (:mod:`.protocol`), the swarm
access tokens the hub signs and peers check (:mod:`.tokens`), which experiment a worker joins (:mod:`.choice`), the
settings a hub proposes for a task (:mod:`.proposal`) and the platforms the worker runs on (:mod:`.platforms`).

Imports nothing else of swarmhub, and neither torch, FastAPI nor SQLAlchemy."""
