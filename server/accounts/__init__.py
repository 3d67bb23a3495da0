"""Accounts: users, browser sessions and API tokens (:mod:`.users`), the device login grant (:mod:`.device`)
and what one account may cost the hub (:mod:`.quotas`)."""
