"""NSQ as a transport: protocol codec, connections, lookupd discovery, the subscription
(RDY, FIN/REQ/TOUCH) and producers.

Knows nothing of tasks, telemetry SDKs or settings files; from the rest of the package it
imports only the transport seam (:mod:`nsqworker.transport`, :mod:`nsqworker.message`),
:mod:`nsqworker.errors` and :mod:`nsqworker.settings`. Task policy (attempts, retry
delays, dead letters, backoff, drain) is the dispatcher's (:mod:`nsqworker.dispatch`).
"""
