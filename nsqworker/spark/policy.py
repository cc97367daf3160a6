"""What a message may not make a Spark job do (docs/security.md, docs/spark.md).

A ``@spark_task`` handler builds its :class:`~nsqworker.spark.job.SparkJob` from a
message, and anyone who can publish writes the message. So, whatever the handler
puts in the job:

* ``conf`` keys that run or fetch code (JVM options, jars, plugins, pod templates,
  volumes, images, credentials) are refused: they belong in the image's
  ``spark-defaults.conf`` or the Spark operator's defaults, set by the operator;
* ``env`` names that change what a process loads (``LD_PRELOAD``,
  ``JAVA_TOOL_OPTIONS``, ``PYTHONPATH``...) are refused;
* the Kubernetes runner's ``app`` and ``py_files`` must match ``spark_app_uris``
  (default: ``local://*``, files in the image);
* the local runner's ``app`` and ``py_files`` must be files under the worker's
  directory (no ``..`` out of it, no absolute path elsewhere), and a remote URI
  (``s3a://``, ``https://``) is refused;
* the local ``spark-submit`` gets an allowlisted environment, not the worker's
  (which holds ``NSQWORKER_AUTH_SECRET`` and perhaps cloud keys);
* conf values and env values are masked in debug logs.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

__all__ = [
    "CHILD_ENV",
    "DEFAULT_APP_URIS",
    "DENIED_CONF",
    "DENIED_ENV",
    "allowed_app_uri",
    "child_environment",
    "denied_conf",
    "denied_env",
    "masked_command",
    "outside_root",
]

#: Spark properties a job may not set (fnmatch patterns, case-insensitive).
DENIED_CONF: Final = (
    "spark.*.extrajavaoptions", "spark.*.extraclasspath", "spark.*.extralibrarypath",
    "spark.jars", "spark.jars.*", "spark.files", "spark.archives", "spark.submit.*",
    "spark.plugins", "spark.*.plugins", "spark.extralisteners", "spark.sql.extensions",
    "spark.sql.queryexecutionlisteners", "spark.sql.streaming.streamingquerylisteners",
    "spark.pyspark.*", "spark.python.*", "spark.executorenv.*", "spark.yarn.*",
    "spark.kubernetes.driverenv.*", "spark.kubernetes.*.volumes.*",
    "spark.kubernetes.*podtemplate*", "spark.kubernetes.container.image*",
    "spark.kubernetes.*.container.image*", "spark.kubernetes.authenticate.*",
    "spark.kubernetes.*.secrets.*", "spark.kubernetes.*.secretkeyref.*",
    "spark.kubernetes.namespace", "spark.kubernetes.*.serviceaccountname",
    "spark.kubernetes.*.pod.name", "spark.kubernetes.*.annotation.*",
    "spark.kubernetes.*.label.*", "spark.master", "spark.driver.host",
    "spark.hadoop.fs.*.impl", "*credential*", "spark.hadoop.*.access.key",
    "spark.hadoop.*.secret.key", "spark.hadoop.*.session.token",
    "spark.redaction.regex", "spark.ui.filters", "spark.*.filter.*",
    # JVM options read before extraJavaOptions; scripts and classes run to find devices
    "spark.*.defaultjavaoptions", "spark.*.resource.*.discoveryscript",
    "spark.resources.discoveryplugin", "spark.r.command", "spark.r.*.command",
    # where storage is: a job must not send the operator's storage credentials (or its
    # data) to another endpoint or proxy, or swap the default filesystem
    "spark.hadoop.fs.*endpoint*", "spark.hadoop.fs.*.proxy.*", "spark.hadoop.fs.defaultfs",
    "spark.hadoop.fs.default.name", "spark.hadoop.fs.*.root.url",
    "spark.hadoop.fs.azure.account.*",
)  # fmt: skip
#: Environment variable names a job may not set (fnmatch patterns, case-sensitive).
DENIED_ENV: Final = (
    "LD_*", "DYLD_*", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "JAVA_HOME",
    "CLASSPATH", "PATH", "PYTHON*", "PYSPARK_*", "SPARK_*", "HADOOP_*", "BASH_ENV", "ENV",
    "IFS", "SHELLOPTS", "PERL5*", "NODE_OPTIONS", "NSQWORKER_*", "KUBERNETES_*",
    "GCONV_PATH", "OPENSSL_*", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
    "http_proxy", "https_proxy", "all_proxy", "no_proxy",
)  # fmt: skip
#: Remote app URIs the Kubernetes runner takes unless ``spark_app_uris`` says otherwise.
DEFAULT_APP_URIS: Final = ("local://*",)
#: What the local spark-submit inherits of the worker's environment (patterns).
CHILD_ENV: Final = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_*", "TZ", "TMPDIR", "JAVA_HOME",
    "HADOOP_CONF_DIR", "SPARK_CONF_DIR", "SPARK_LOCAL_IP", "SPARK_LOCAL_DIRS",
    "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV",
)  # fmt: skip
_SECRET_WORDS: Final = ("secret", "password", "token", "key", "credential", "auth")


def denied_conf(key: str) -> bool:
    """Whether a job may not set the Spark property ``key``."""
    lowered = key.lower()
    return any(fnmatch.fnmatchcase(lowered, pattern) for pattern in DENIED_CONF)


def denied_env(name: str) -> bool:
    """Whether a job may not set the environment variable ``name``."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in DENIED_ENV)


def allowed_app_uri(uri: str, patterns: Iterable[str]) -> bool:
    """Whether the Kubernetes runner may give the driver ``uri`` to fetch: it matches
    one of ``patterns`` (``spark_app_uris``, fnmatch) and has no ``.`` or ``..`` path
    segment (a server may resolve them out of the prefix a pattern names)."""
    path = uri.split("://", 1)[-1].split("?", 1)[0]
    if any(part in (".", "..") for part in path.split("/")):
        return False
    return any(fnmatch.fnmatchcase(uri, pattern) for pattern in patterns)


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` the local spark-submit inherits (:data:`CHILD_ENV`)."""
    return {k: v for k, v in environ.items() if any(fnmatch.fnmatchcase(k, p) for p in CHILD_ENV)}


def outside_root(path: Path, root: Path) -> bool:
    """Whether ``path`` (symbolic links followed) leaves ``root``."""
    return not path.resolve().is_relative_to(root.resolve())


def masked_command(command: Iterable[str]) -> list[str]:
    """``command`` for a debug log: every ``--conf key=value`` whose key looks secret
    has its value masked, and ``--conf`` values of the job's own keys are kept."""
    out: list[str] = []
    conf_next = False
    for part in command:
        if conf_next and "=" in part:
            key, _, _ = part.partition("=")
            if any(word in key.lower() for word in _SECRET_WORDS):
                part = f"{key}=**********"
        conf_next = part == "--conf"
        out.append(part)
    return out
