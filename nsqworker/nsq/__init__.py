"""The NSQ client: protocol codec, connections, lookupd discovery, consumer and producers.

Knows nothing of tasks, telemetry SDKs or settings files; it imports only
:mod:`nsqworker.errors` and :mod:`nsqworker.settings` from the rest of the package.
The layers above reach in through the hooks these modules take as parameters.
"""
