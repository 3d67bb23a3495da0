"""Live dashboards: the channels viewers subscribe to (:mod:`.channels`) and the snapshot of an experiment they are
sent (:mod:`.snapshots`), built the same way for the JSON API."""
