"""The shell's ``NSQWORKER_*`` settings, set aside while tests run.

``nsqworker dev broker`` asks you to export ``NSQWORKER_*`` so ``nsqworker run`` finds the
broker; ``Settings()`` in a test reads them too, and a test worker given its own nsqd
would also subscribe through the dev broker's nsqlookupd and take its messages. So the
pytest plugin removes every variable that names a setting (and ``NSQWORKER_CONFIG``)
from the environment for the run, says which in the header, and puts them back at the
end; ``pytest --nsqworker-shell-env`` keeps them, and the ``shell_settings_env`` fixture
hands them to a test that wants them. Variables of the test tools themselves
(``NSQWORKER_TOOLS_BIN``...) are not settings and stay.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["restore", "set_aside", "settings_variables"]


def settings_variables() -> frozenset[str]:
    """Every environment variable ``Settings`` reads: each setting's, each renamed
    setting's old one, and ``NSQWORKER_CONFIG``."""
    from nsqworker.settings import Settings

    names = {*Settings.model_fields, *Settings.renamed()}
    return frozenset({"NSQWORKER_CONFIG", *(Settings.env_name(n) for n in names)})


def set_aside(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Remove the settings' variables from ``environ``; what was removed."""
    known = settings_variables()
    taken = {name: environ[name] for name in sorted(environ) if name.upper() in known}
    for name in taken:
        del environ[name]
    return taken


def restore(taken: dict[str, str], environ: MutableMapping[str, str] = os.environ) -> None:
    """Put back what :func:`set_aside` removed (a value set meanwhile wins)."""
    for name, value in taken.items():
        environ.setdefault(name, value)
