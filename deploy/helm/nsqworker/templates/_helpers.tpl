{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "nsqworker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full object name: release-chart, or the release name when it already has the chart's. */}}
{{- define "nsqworker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nsqworker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nsqworker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nsqworker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "nsqworker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nsqworker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nsqworker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "nsqworker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Namespace of the SparkApplications. */}}
{{- define "nsqworker.leaseName" -}}
{{- default (printf "%s-schedules" (include "nsqworker.fullname" .)) .Values.schedules.leaseName }}
{{- end }}

{{- define "nsqworker.sparkNamespace" -}}
{{- default .Release.Namespace .Values.spark.kubernetes.namespace }}
{{- end }}

{{/*
A value as environment text: whole numbers without an exponent (Helm reads every
number as a float, which would print 1000000 as 1e+06), lists comma-joined.
*/}}
{{- define "nsqworker.envValue" -}}
{{- $v := . }}
{{- if kindIs "slice" $v }}
{{- $parts := list }}
{{- range $v }}{{ $parts = append $parts (include "nsqworker.envValue" .) }}{{ end }}
{{- join "," $parts }}
{{- else if kindIs "map" $v }}
{{- toJson $v }}
{{- else if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) }}
{{- int64 $v }}
{{- else }}
{{- $v }}
{{- end }}
{{- end }}

{{/* Seconds of the pod's grace period; fails when it does not cover the drain. */}}
{{- define "nsqworker.gracePeriod" -}}
{{- $drain := float64 .Values.drainTimeout }}
{{- $supervisorKill := addf $drain 5 }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- int64 (ceil (addf $drain 15)) }}
{{- else }}
{{- $grace := float64 .Values.terminationGracePeriodSeconds }}
{{- if le $grace $supervisorKill }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be more than drainTimeout + 5 (%v): the supervisor drains for drainTimeout, then kills its workers 5 s later, and Kubernetes must not kill the pod first; raise terminationGracePeriodSeconds or lower drainTimeout" (include "nsqworker.envValue" .Values.terminationGracePeriodSeconds) (include "nsqworker.envValue" $supervisorKill)) }}
{{- end }}
{{- int64 $grace }}
{{- end }}
{{- end }}

{{/* Combinations of values the schema cannot express. */}}
{{- define "nsqworker.validate" -}}
{{- if and .Values.keda.enabled (eq .Values.transport "rabbitmq-stream") }}
{{- fail "keda.enabled is not for transport rabbitmq-stream: KEDA has no RabbitMQ stream scaler. Set keda.enabled=false and autoscaling.enabled=true (a HorizontalPodAutoscaler on CPU, or on nsqworker_messages_in_flight through the Prometheus Adapter), see docs/kubernetes.md#autoscaling" }}
{{- end }}
{{- if and .Values.keda.enabled .Values.autoscaling.enabled }}
{{- fail "keda.enabled and autoscaling.enabled are exclusive: KEDA makes its own HorizontalPodAutoscaler; turn one off" }}
{{- end }}
{{- if .Values.keda.enabled }}
{{- if not .Values.keda.channels }}
{{- fail "keda.enabled needs keda.channels: one {topic, channel} per task (`nsqworker tasks <module>` lists them)" }}
{{- end }}
{{- if and (eq .Values.transport "nsq") (not .Values.nsq.lookupdHttpAddresses) }}
{{- fail "keda.enabled needs nsq.lookupdHttpAddresses: the nsq trigger reads channel depths from nsqlookupd" }}
{{- end }}
{{- if and (eq .Values.transport "nats") (not .Values.nats.monitoringEndpoint) }}
{{- fail "keda.enabled on nats needs nats.monitoringEndpoint: the nats-jetstream trigger reads the consumer's pending count from the servers' monitoring port (host:8222)" }}
{{- end }}
{{- if gt (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount) }}
{{- fail (printf "keda.minReplicaCount (%d) is more than keda.maxReplicaCount (%d)" (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount)) }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%d) is more than autoscaling.maxReplicas (%d)" (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and (eq .Values.transport "nsq") (not .Values.nsq.lookupdHttpAddresses) (not .Values.nsq.nsqdTcpAddresses) }}
{{- fail "set nsq.lookupdHttpAddresses or nsq.nsqdTcpAddresses: workers need somewhere to find nsqd" }}
{{- end }}
{{- if and (eq .Values.transport "rabbitmq-stream") (not .Values.rabbitmqStream.existingSecret) }}
{{- fail "transport rabbitmq-stream needs rabbitmqStream.existingSecret: a Secret with the rabbitmq-stream:// URI (it holds the password)" }}
{{- end }}
{{- if and (eq .Values.transport "nats") (not .Values.nats.servers) }}
{{- fail "transport nats needs nats.servers: one or more nats://host:port" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "tls.enabled needs tls.existingSecret: the name of a Secret with the CA bundle (and client certificate and key)" }}
{{- end }}
{{- if and .Values.tls.enabled (ne (empty .Values.tls.certKey) (empty .Values.tls.keyKey)) }}
{{- fail "tls.certKey and tls.keyKey go together: set both (a client certificate) or neither" }}
{{- end }}
{{- range $name, $value := .Values.otel.env }}
{{- if contains "HEADERS" $name }}
{{- fail (printf "otel.env.%s would put the collector's API keys in a ConfigMap: store them in a Secret and set otel.headersSecret" $name) }}
{{- end }}
{{- end }}
{{- if and .Values.spark.kubernetes.enabled (not .Values.spark.kubernetes.image) }}
{{- fail "spark.kubernetes.enabled needs spark.kubernetes.image: the image of the Spark driver and executors" }}
{{- end }}
{{- end }}

{{/* The container's environment that is not secret: NSQWORKER_* settings and OTEL_*. */}}
{{- define "nsqworker.env" -}}
NSQWORKER_TRANSPORT: {{ .Values.transport | quote }}
NSQWORKER_WORKERS: {{ include "nsqworker.envValue" .Values.workers | quote }}
NSQWORKER_DRAIN_TIMEOUT: {{ include "nsqworker.envValue" .Values.drainTimeout | quote }}
NSQWORKER_HEALTH_PORT: {{ include "nsqworker.envValue" .Values.healthPort | quote }}
NSQWORKER_HEALTH_HOST: {{ .Values.healthHost | quote }}
NSQWORKER_LOG_LEVEL: {{ .Values.logLevel | quote }}
NSQWORKER_LOG_FORMAT: {{ .Values.logFormat | quote }}
{{- if eq .Values.transport "nsq" }}
{{- with .Values.nsq.lookupdHttpAddresses }}
NSQWORKER_LOOKUPD_HTTP_ADDRESSES: {{ include "nsqworker.envValue" . | quote }}
{{- end }}
{{- with .Values.nsq.nsqdTcpAddresses }}
NSQWORKER_NSQD_TCP_ADDRESSES: {{ include "nsqworker.envValue" . | quote }}
{{- end }}
{{- end }}
{{- if eq .Values.transport "nats" }}
NSQWORKER_NATS_SERVERS: {{ include "nsqworker.envValue" .Values.nats.servers | quote }}
NSQWORKER_NATS_STREAM_REPLICAS: {{ include "nsqworker.envValue" .Values.nats.streamReplicas | quote }}
{{- with .Values.nats.stream }}
NSQWORKER_NATS_STREAM: {{ . | quote }}
{{- end }}
{{- if and .Values.nats.auth.existingSecret .Values.nats.auth.credsKey }}
NSQWORKER_NATS_CREDS_FILE: "/etc/nsqworker/nats/creds"
{{- end }}
{{- end }}
{{- if .Values.tls.enabled }}
NSQWORKER_TLS_V1: "true"
NSQWORKER_TLS_VERIFY: {{ .Values.tls.verify | toString | quote }}
{{- with .Values.tls.caKey }}
NSQWORKER_TLS_CA_FILE: {{ printf "/etc/nsqworker/tls/%s" . | quote }}
{{- end }}
{{- if .Values.tls.certKey }}
NSQWORKER_TLS_CERT_FILE: {{ printf "/etc/nsqworker/tls/%s" .Values.tls.certKey | quote }}
NSQWORKER_TLS_KEY_FILE: {{ printf "/etc/nsqworker/tls/%s" .Values.tls.keyKey | quote }}
{{- end }}
{{- with .Values.tls.serverName }}
NSQWORKER_TLS_SERVER_NAME: {{ . | quote }}
{{- end }}
{{- end }}
{{- if .Values.spark.kubernetes.enabled }}
NSQWORKER_SPARK_RUNNER: {{ eq .Values.spark.kubernetes.runner "native" | ternary "kubernetes-native" "kubernetes" | quote }}
{{- if eq .Values.spark.kubernetes.runner "native" }}
{{- if .Values.spark.kubernetes.driverTemplate }}
NSQWORKER_SPARK_DRIVER_TEMPLATE: "/etc/nsqworker/spark/driver.yaml"
{{- end }}
{{- if .Values.spark.kubernetes.executorTemplate }}
NSQWORKER_SPARK_EXECUTOR_TEMPLATE: "/etc/nsqworker/spark/executor.yaml"
{{- end }}
{{- end }}
NSQWORKER_SPARK_NAMESPACE: {{ include "nsqworker.sparkNamespace" . | quote }}
NSQWORKER_SPARK_IMAGE: {{ .Values.spark.kubernetes.image | quote }}
NSQWORKER_SPARK_SERVICE_ACCOUNT: {{ .Values.spark.kubernetes.serviceAccount | quote }}
NSQWORKER_SPARK_TTL: {{ include "nsqworker.envValue" .Values.spark.kubernetes.ttlSeconds | quote }}
NSQWORKER_SPARK_APP_URIS: {{ toJson .Values.spark.kubernetes.appUris | quote }}
{{- end }}
{{- if .Values.schedules.enabled }}
NSQWORKER_SCHEDULE_LEADER: "kubernetes"
NSQWORKER_SCHEDULE_LEASE_NAME: {{ include "nsqworker.leaseName" . | quote }}
{{- end }}
{{- range $name, $value := .Values.settings }}
{{ printf "NSQWORKER_%s" (upper $name) }}: {{ include "nsqworker.envValue" $value | quote }}
{{- end }}
OTEL_SERVICE_NAME: {{ default (include "nsqworker.fullname" .) .Values.otel.serviceName | quote }}
{{- with .Values.otel.endpoint }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ . | quote }}
{{- end }}
{{- range $name, $value := .Values.otel.env }}
{{ $name }}: {{ include "nsqworker.envValue" $value | quote }}
{{- end }}
{{- end }}

{{/*
"true" when the native Spark runner has pod templates to mount, else empty.
*/}}
{{- define "nsqworker.sparkTemplates" -}}
{{- $k := .Values.spark.kubernetes }}
{{- if and $k.enabled (eq $k.runner "native") (or $k.driverTemplate $k.executorTemplate) }}true{{ end }}
{{- end }}
