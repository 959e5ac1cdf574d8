"""etiquette_proxy/health/{site,score,history,signals}.py as they were at 23b2c01, copied
(`git show 23b2c01:etiquette_proxy/health/<module>.py`, their imports of one another pointed
here): the objects the compact forms replaced, run beside them by test_health_compact.py."""
