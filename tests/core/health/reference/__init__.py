"""SiteHealth as it was before its compact forms and one-lookup response path (main at 5976120):
site.py, signals.py, score.py and history.py copied unchanged but for their imports. The tests
in test_health_reference.py run generated sequences through it and through etiquette_proxy.health
and require the same signals, band changes, assessments, history and stored state."""
