"""One peer's training: the hivemind peer a task trains in (:mod:`.peer`), its step loop (:mod:`.loop`), the
optimizer that averages with the swarm (:mod:`.optimizer`), LAMB (:mod:`.lamb`), averaging in the background
(:mod:`.overlap`) and the peer's swarm access (:mod:`.access`). Imported by volunteers' workers and by the server's
peer processes, never by the web process."""
