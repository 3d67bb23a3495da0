"""HTTP plumbing around the routes: request dependencies (:mod:`.deps`), rate limits, the body limit, logging and
request metrics (:mod:`.observability`), page rendering (:mod:`.views`) and the worker wheel this hub serves
(:mod:`.worker_package`). Domain packages never import it."""
