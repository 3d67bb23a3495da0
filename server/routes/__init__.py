"""HTTP and websocket routes: each parses a request, makes one call into a domain package and returns (``api`` and
``data`` the JSON API and files, ``ws`` the workers' report socket and the dashboards' live channel, ``pages`` and
its ``*_pages`` the HTML pages, ``hub``, ``volunteers``, ``teams`` and ``tasks`` the public JSON, ``probe`` the
bandwidth probe). Routes reach no swarm internals and not the metric store (tests/test_imports.py)."""
