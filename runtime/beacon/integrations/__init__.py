"""Beacon inside training frameworks, one module each, importing its framework only when imported:

    from beacon.integrations.lightning import BeaconLogger, BeaconPhases      # `beacon[lightning]`
    from beacon.integrations.huggingface import BeaconCallback                # `beacon[transformers]`

`import beacon` never imports a framework.
"""
