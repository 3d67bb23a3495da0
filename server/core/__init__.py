"""The server's foundations: typed settings (:mod:`.settings`), the database engine and sessions (:mod:`.db`),
errors (:mod:`.errors`), passwords, tokens and CSRF (:mod:`.security`) and trusted proxies (:mod:`.proxies`).
Imports nothing of the server outside this package."""
