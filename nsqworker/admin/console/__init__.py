"""``nsqworker console``: a web console over the whole fleet.

Three pages: the tasks (backlog from the broker, in flight, rates, retries, dead letters,
last error), the worker processes (pid or pod, memory, uptime, what each holds in flight)
and the dead letters (list, replay, purge). Workers are found from ``console_workers``
(the health URLs of ``nsqworker run``) or from Kubernetes pods by label selector.
Read-only unless ``console_token`` is set; see docs/security.md.

Its settings are in :mod:`nsqworker.settings.console`; :func:`.app.create_app` needs the
``console`` extra (Starlette, Jinja2, uvicorn).
"""
