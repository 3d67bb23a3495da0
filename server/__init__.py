"""swarmhub's server (extra ``[server]``): ``app`` builds the FastAPI app from :mod:`.services`, ``cli`` and
``commands`` are its entry points. The rest is in packages by capability: ``core`` (settings, database, security),
``http`` (dependencies and middleware around the routes), ``routes`` (HTTP to one call into a domain package), and the
domains ``accounts``, ``experiments``, ``corpus``, ``metrics``, ``live``, ``ledger``, ``community``, ``teams``,
``swarm`` (the per-experiment peer processes) and ``models`` (the database tables).
"""
