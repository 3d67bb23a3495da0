"""The ledger of verified work: the swarm's signed progress records (:mod:`.contributions`), the averaging rounds
the server's auxiliary peer witnessed (:mod:`.witnessed`) and the milestones volunteers reach (:mod:`.milestones`)."""
