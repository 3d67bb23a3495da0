"""HTML pages: forms post back here with a CSRF token; services do the work.

The routes are the account pages' (``account_pages.py``), the experiment pages' (``experiment_pages.py``), the
volunteers' public pages' (``volunteer_pages.py``) and the team pages' (``team_pages.py``), which add them to one
router (``page_helpers.router``) as they are imported: this module imports them all, and the app includes its
``router``.
"""

from __future__ import annotations

from swarmhub.server.routes import account_pages, experiment_pages, team_pages, volunteer_pages
from swarmhub.server.routes.page_helpers import router

__all__ = ["account_pages", "experiment_pages", "router", "team_pages", "volunteer_pages"]
