"""The measuring processes: ``python -m bench.child MODULE:FUNCTION 'JSON'`` runs
``bench.clients.MODULE.FUNCTION(params)``. These modules import only what the client
they measure needs (never the runner's helpers, pytest or httpx)."""
