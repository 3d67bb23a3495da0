"""The `swarmhub` command: its entry point (:mod:`.main`), login, upgrade, the background service's commands and
the commands other packages register through the ``swarmhub.commands`` entry-point group (the server's among them:
this package never imports the server)."""
