"""What keeps a swarm of strangers honest and in step: swarm access and DHT authentication (:mod:`.access`,
:mod:`.dht_auth`, :mod:`.deny_list`), robust aggregation and its policy (:mod:`.robust`, :mod:`.aggregation`,
:mod:`.policy`, :mod:`.flags`), the checks on a downloaded state (:mod:`.state_guard`), the swarm's epoch
(:mod:`.epoch`), matchmaking and load balancing, and the witness record of each averaging round (:mod:`.witness`).
Imports hivemind and torch; never the server, the CLI or the join package."""
