"""Serving benchmarks: ``dflash-sglang bench`` and the SGLang server launcher it shares with the tests.

Modules: ``server`` (start/stop a real SGLang server on the dflash CPU platform), ``client``
(timed streaming requests), ``stats`` (pure statistics), ``runner`` (methods x concurrency levels),
``report`` (results.json and plots), ``machine`` (hardware/software description), ``cli``.
Importing this package imports nothing heavy.
"""
