"""The Spark section: where ``@spark_task`` jobs run and how ``@spark_session_task``
sessions start (:mod:`nsqworker.spark`, docs/spark.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator
from pydantic_settings import NoDecode

from nsqworker.settings.base import Seconds, SettingsBase, bounded
from nsqworker.settings.values import app_uri_pattern, split_list

__all__ = ["SparkSettings"]

AppUriPatterns = Annotated[list[Annotated[str, AfterValidator(app_uri_pattern)]], NoDecode]


class SparkSettings(SettingsBase):
    """Spark jobs and sessions."""

    # -- Spark jobs (nsqworker.spark, docs/spark.md)
    spark_runner: Literal["local", "kubernetes", "kubernetes-native"] = Field(
        "local",
        description="Where @spark_task jobs run: local (spark-submit), kubernetes (a"
        " SparkApplication for the Spark operator) or kubernetes-native (a driver pod).",
    )
    spark_app_roots: list[str] = Field(
        default_factory=list, description="Directories local Spark apps must be in; default: ."
    )
    spark_app_uris: AppUriPatterns = Field(
        default_factory=lambda: ["local://*"],
        description="App URIs (patterns) the kubernetes runner may run; default: local://*.",
    )
    spark_master: str = Field(
        "local[*]",
        min_length=1,
        pattern=r"^\S+$",
        description="--master of the local runner: local[N], local[*], spark://host:port...",
    )
    spark_namespace: str = Field(
        "default",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="Namespace of SparkApplications (kubernetes runner).",
    )
    spark_image: str | None = Field(
        None, min_length=1, description="Image of driver and executors (kubernetes runner)."
    )
    spark_service_account: str = Field(
        "spark", min_length=1, description="Service account of the Spark driver (kubernetes)."
    )
    spark_driver_template: str | None = Field(
        None,
        min_length=1,
        description="Pod template (YAML file) of driver pods (kubernetes-native runner).",
    )
    spark_executor_template: str | None = Field(
        None,
        min_length=1,
        description="Pod template (YAML file) of executor pods (kubernetes-native runner).",
    )
    spark_ttl: Seconds = bounded(
        3600.0, 0, 30 * 86400, "Seconds a finished SparkApplication is kept before removal."
    )
    # -- Spark sessions (@spark_session_task, nsqworker.spark.session, docs/spark.md)
    spark_remote: str | None = Field(
        None, pattern=r"^sc://\S+$", description="Spark Connect server of sessions: sc://host:15002"
    )
    spark_session_start: Literal["first_message", "worker_start"] = Field(
        "first_message", description="When a worker starts its Spark session."
    )
    spark_session_conf: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Spark conf of the session (spark.* keys)."
    )

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator("spark_app_uris", mode="before")
    @classmethod
    def _spark_list(cls, value: Any) -> Any:
        return split_list(value)
