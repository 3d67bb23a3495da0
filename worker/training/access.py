"""This peer's admission to the swarm while it trains: the DHT authorizer and the roster entry, kept current.

The swarm's token (from the server) admits this peer's key; :class:`PeerAccess` renews it before it expires and
republishes it on the roster, so that other peers' averagers keep talking to this one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from swarmhub.common.protocol import JoinResponse, SwarmToken
from swarmhub.worker.errors import FINAL_REFUSALS, WorkerError
from swarmhub.worker.swarm import access as swarm_access

# Logged under the training module's name: one logger for everything `train` runs.
logger = logging.getLogger("swarmhub.worker.training.peer")


class PeerAccess:
    """This peer's admission to the swarm: the DHT authorizer (which runs in hivemind's DHT process and
    renews its own token) and the roster entry that lets other peers' averagers talk to us (renewed here)."""

    def __init__(
        self,
        join: JoinResponse,
        identity_path: Path,
        fetch_token: Callable[[], SwarmToken] | None,
        deny_list: swarm_access.DenyList,
    ):
        self.run_id = join.run_id
        self.key = swarm_access.load_or_create_identity(identity_path)
        swarm_access.use_as_process_key(self.key)  # progress records are signed with the key the token admits
        self.experiment_key = swarm_access.public_key_from_text(join.experiment_public_key)
        self.token = swarm_access.token_from_wire(join.swarm_token.model_dump())
        expires = swarm_access.parse_expiry(self.token.expiration_time)
        lifetime = (expires - datetime.now(timezone.utc)) if expires else swarm_access.REFRESH_MARGIN
        self.margin = min(swarm_access.REFRESH_MARGIN, lifetime / 4)
        self._fetch_token = fetch_token
        self.refused: WorkerError | None = None  # a renewal refused for good (FINAL_REFUSALS): training stops
        self._published: str | None = None
        self._lock = threading.Lock()
        self.authorizer = swarm_access.SwarmAuthorizer(
            self.key,
            self.experiment_key,
            self.run_id,
            self.fetch,
            first_token=self.token,
            refresh_margin=self.margin,
            denied=deny_list,
        )

    def fetch(self) -> Any:
        if self._fetch_token is not None:
            try:
                self.token = swarm_access.token_from_wire(self._fetch_token().model_dump())
            except Exception as exc:  # unreachable or failing for now: the current token may still serve
                logger.warning("could not renew the swarm token: %s", getattr(exc, "message", exc))
                if isinstance(exc, WorkerError) and exc.exit_code in FINAL_REFUSALS:
                    self.refused = self.refused or exc
        return self.token

    def keep_published(self, dht: Any) -> None:
        """Renew the token when it nears expiry and (re)publish it on the roster; cheap when nothing is due."""
        with self._lock:
            if self.authorizer.does_token_need_refreshing(self.token):
                self.fetch()
            if self._published != self.token.signature:
                if swarm_access.publish_roster_entry(dht, self.run_id, self.token):
                    self._published = self.token.signature

    def keep_publishing(self, dht: Any, stop: threading.Event) -> threading.Thread:
        """Keep the token and roster entry current in the background until ``stop``: a training step can block
        as long as an averaging round lasts, and a roster entry that expires meanwhile makes the other peers
        refuse this one, so that the next round fails too."""
        interval = max(min(5.0, self.margin.total_seconds() / 2), 0.5)

        def run() -> None:
            while not stop.wait(interval):
                try:
                    self.keep_published(dht)
                except Exception as exc:
                    logger.warning("could not renew this peer's roster entry: %r", exc)

        thread = threading.Thread(target=run, daemon=True, name="swarmhub-roster")
        thread.start()
        return thread
