"""What both Kubernetes Spark runners write of a job: its name, labels, annotations and
environment, and the API client they use (in-cluster credentials, else the kubeconfig).

A job's objects are named from the message (:func:`application_name`) so a redelivery
finds what its first delivery created, and annotated with the exact topic, channel and
message id so it adopts only its own.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nsqworker.errors import ConfigurationError
from nsqworker.spark.job import JobContext, SecretRef, SparkJob

__all__ = [
    "LABEL_PREFIX",
    "JobRef",
    "application_name",
    "check_owner",
    "job_annotations",
    "job_env",
    "job_labels",
    "kube_api_client",
]

LABEL_PREFIX = "nsqworker.io/"
NAME_MAX = 63
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def application_name(topic: str, channel: str, message_id: str) -> str:
    """The SparkApplication's name for one message: a DNS-1123 label of at most 63
    characters, starting with a letter; the same inputs always give the same name.

    ``<topic>-<channel>-<id>`` when that is already such a label; otherwise a cleaned,
    shortened prefix and a hash of the three exact values, so names that clean to the
    same text (``a_b`` and ``a.b``) stay apart.
    """
    plain = f"{topic}-{channel}-{message_id}"
    if len(plain) <= NAME_MAX and _DNS_LABEL.match(plain):
        return plain
    digest = hashlib.sha256(f"{topic}\0{channel}\0{message_id}".encode()).hexdigest()[:12]
    prefix = _NOT_DNS.sub("-", plain.lower()).strip("-")
    prefix = re.sub("-{2,}", "-", prefix)[: NAME_MAX - len(digest) - 1].rstrip("-")
    if not prefix or not prefix[0].isalpha():
        prefix = ("j-" + prefix)[: NAME_MAX - len(digest) - 1].rstrip("-")
    return f"{prefix}-{digest}"


def _label_value(text: str) -> str:
    """``text`` as a label value (<= 63 of ``[A-Za-z0-9_.-]``, alphanumeric ends)."""
    return _LABEL_BAD.sub("_", text)[:63].strip("_.-")


def _env_var(name: str, value: str | SecretRef) -> dict[str, Any]:
    if isinstance(value, SecretRef):  # the value stays in the Secret, out of the body
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": value.name, "key": value.key}}}
    return {"name": name, "value": value}


def job_labels(ctx: JobContext) -> dict[str, str]:
    """Labels of a job's objects: managed by nsqworker, the topic and channel."""
    return {
        "app.kubernetes.io/managed-by": "nsqworker",
        LABEL_PREFIX + "topic": _label_value(ctx.topic),
        LABEL_PREFIX + "channel": _label_value(ctx.channel),
    }


def job_annotations(ctx: JobContext) -> dict[str, str]:
    """Annotations of a job's objects: the exact topic, channel, message id and task
    (a redelivery adopts only what its own message created)."""
    return {
        LABEL_PREFIX + "topic": ctx.topic,
        LABEL_PREFIX + "channel": ctx.channel,
        LABEL_PREFIX + "message-id": ctx.message_id,
        LABEL_PREFIX + "task": ctx.task,
    }


def job_env(job: SparkJob) -> list[dict[str, Any]]:
    """The job's ``env`` as container EnvVars (a SecretRef as a ``secretKeyRef``)."""
    return [_env_var(key, value) for key, value in sorted(job.env.items())]


def kube_api_client(runner: str) -> Any:
    """A ``kubernetes`` ApiClient: in-cluster credentials, else the kubeconfig."""
    try:
        client: Any = importlib.import_module("kubernetes.client")
        config: Any = importlib.import_module("kubernetes.config")
    except ImportError as exc:
        raise ConfigurationError(
            f"the {runner} Spark runner needs the kubernetes client: "
            "pip install 'nsq-worker[kubernetes]'"
        ) from exc
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # KUBECONFIG read now, not when the kubernetes package was imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
    return client.ApiClient()


@dataclass
class JobRef:
    """A submitted job's object (a SparkApplication or a driver pod): where it is, and
    whether this delivery adopted it (an earlier delivery of the message created it)."""

    namespace: str
    name: str
    adopted: bool
    submitted: float = field(default_factory=time.monotonic)

    @property
    def job_id(self) -> str:
        """The runner's id of the job: the object's name."""
        return self.name


def check_owner(what: str, found: Mapping[str, str] | None, want: Mapping[str, str]) -> None:
    """Raise unless ``found`` (an existing object's annotations) names the same topic,
    channel and message id as ``want``: a redelivery adopts only its own job.

    Raises:
        RuntimeError: naming ``what`` and the first annotation that differs.
    """
    notes = found or {}
    for key in ("topic", "channel", "message-id"):
        if notes.get(LABEL_PREFIX + key) != want[LABEL_PREFIX + key]:
            raise RuntimeError(
                f"{what} exists but belongs to another message "
                f"({LABEL_PREFIX}{key}={notes.get(LABEL_PREFIX + key)!r}); not adopting it"
            )
