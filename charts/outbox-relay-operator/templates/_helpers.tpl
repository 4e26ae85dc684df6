{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "outbox-relay-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects. */}}
{{- define "outbox-relay-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels selected by the Deployment and the Service: never change them after the first release. */}}
{{- define "outbox-relay-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-relay-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox-relay-operator.labels" -}}
helm.sh/chart: {{ include "outbox-relay-operator.chart" . }}
{{ include "outbox-relay-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: outbox-relay
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "outbox-relay-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "outbox-relay-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "outbox-relay-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}
{{- end -}}

{{/* "true" when leader election is on: forced by the value, or needed by more than one replica. */}}
{{- define "outbox-relay-operator.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) -}}
true
{{- else -}}
false
{{- end -}}
{{- end -}}

{{/*
The operator's namespaced permissions, shared by the ClusterRole (cluster-wide mode) and the
per-namespace Roles (watchNamespaces mode). Exactly the operator contract: nothing else.
*/}}
{{- define "outbox-relay-operator.rules" -}}
- apiGroups: ["outboxrelay.io"]
  resources: ["outboxrelays"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["outboxrelay.io"]
  resources: ["outboxrelays/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["outboxrelay.io"]
  resources: ["outboxrelays/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/*
The TCP port of tracing.otlpEndpoint: the URL's own, else its scheme's (443 for https, 80 for
http); empty without an endpoint. The NetworkPolicy opens it for the operator's span export.
*/}}
{{- define "outbox-relay-operator.otlpPort" -}}
{{- with (.Values.tracing | default dict).otlpEndpoint -}}
{{- $url := urlParse . -}}
{{- $port := regexFind "[0-9]+$" (regexFind ":[0-9]+$" $url.host) -}}
{{- if $port -}}
{{- $port -}}
{{- else if eq $url.scheme "https" -}}
443
{{- else -}}
80
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The operator container's OpenTelemetry variables (tracing.*), as an EnvVar list, to go after
POD_NAME and POD_NAMESPACE, which the resource attributes refer to. Empty without
tracing.otlpEndpoint; the service name is the binary's own default.
*/}}
{{- define "outbox-relay-operator.otlpEnv" -}}
{{- $t := .Values.tracing | default dict -}}
{{- $ratio := $t.sampleRatio -}}
{{- $headers := $t.headersSecret | default dict -}}
{{- if $t.otlpEndpoint -}}
{{- $env := list (dict "name" "OTEL_EXPORTER_OTLP_ENDPOINT" "value" (toString $t.otlpEndpoint)) -}}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_OTLP_PROTOCOL" "value" "http/protobuf") -}}
{{- if not (kindIs "invalid" $ratio) -}}
{{- $env = append $env (dict "name" "OTEL_TRACES_SAMPLER" "value" "traceidratio") -}}
{{- $env = append $env (dict "name" "OTEL_TRACES_SAMPLER_ARG" "value" (toString $ratio)) -}}
{{- end -}}
{{- with $headers.name -}}
{{- $ref := dict "name" . "key" ($headers.key | default "headers") -}}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_OTLP_HEADERS" "valueFrom" (dict "secretKeyRef" $ref)) -}}
{{- end -}}
{{- $attributes := printf "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME),k8s.deployment.name=%s" (include "outbox-relay-operator.fullname" .) -}}
{{- $env = append $env (dict "name" "OTEL_RESOURCE_ATTRIBUTES" "value" $attributes) -}}
{{- toYaml $env -}}
{{- else if or (not (kindIs "invalid" $ratio)) $headers.name -}}
{{- fail "tracing.sampleRatio and tracing.headersSecret need tracing.otlpEndpoint (the collector's OTLP/HTTP URL, e.g. http://otel-collector.observability:4318): set it, or remove them" -}}
{{- end -}}
{{- end -}}
