"""The hub's public side: volunteers' profiles (:mod:`.volunteers`), every experiment at a glance
(:mod:`.overview`) and the open statistics exports (:mod:`.exports`)."""
