{{/* Names: <release>-<component>, cut to the 63 characters a label allows. */}}
{{- define "meshserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* A component's name; a worker group's (.group) adds the group's name. */}}
{{- define "meshserve.name" -}}
{{- printf "%s-%s" (include "meshserve.fullname" .root) .component -}}
{{- with .group }}-{{ . }}{{ end -}}
{{- end -}}

{{- define "meshserve.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- with .group }}
meshserve.io/worker-group: {{ . }}
{{- end }}
{{- end -}}

{{/* The worker groups, as JSON: each {group, values (worker's, with the group's own settings
over them), model, autoscaling}. No workerGroups: one group of worker and model, unnamed (its
objects are named as a one-model release's always were). */}}
{{- define "meshserve.workerGroups" -}}
{{- $groups := list -}}
{{- range $g := .Values.workerGroups -}}
{{- $values := deepCopy $.Values.worker -}}
{{- range $k, $v := omit $g "name" "model" "autoscaling" }}{{ $_ := set $values $k $v }}{{ end -}}
{{- $model := deepCopy $.Values.model -}}
{{- range $k, $v := $g.model | default dict }}{{ $_ := set $model $k $v }}{{ end -}}
{{- $scaling := set (deepCopy $.Values.autoscaling.workers) "seriesSelector" "" -}}
{{- range $k, $v := $g.autoscaling | default dict }}{{ $_ := set $scaling $k $v }}{{ end -}}
{{- $groups = append $groups (dict "group" $g.name "values" $values "model" $model "autoscaling" $scaling) -}}
{{- end -}}
{{- if not $groups -}}
{{- $groups = list (dict "group" "" "values" .Values.worker "model" .Values.model "autoscaling" .Values.autoscaling.workers) -}}
{{- end -}}
{{- $names := list -}}
{{- /* A group's settings replace worker's key by key: resources, lora, ... whole. */ -}}
{{- range $groups }}{{ $names = append $names .group }}{{ end -}}
{{- if ne (len $names) (len (uniq $names)) -}}
{{- fail (printf "workerGroups: each group needs a name of its own, got %s" (join ", " $names)) -}}
{{- end -}}
{{- toJson $groups -}}
{{- end -}}

{{- define "meshserve.labels" -}}
{{ include "meshserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The image of a flavor (cpu or gpu): <repository>:<tag>-<flavor>. */}}
{{- define "meshserve.image" -}}
{{- printf "%s:%s-%s" .root.Values.image.repository (.root.Values.image.tag | default .root.Chart.AppVersion) .flavor -}}
{{- end -}}

{{/* Ports: gRPC and Prometheus metrics of each service (docs/deploy.md, "Ports"). */}}
{{- define "meshserve.ports" -}}
{{- $ports := dict "gateway" (list 50051 9100) "router" (list 50052 9102) "cache" (list 50053 9103) "worker" (list 50061 9110) "redis" (list 6379 0) "otel-collector" (list 4317 0) -}}
{{- index $ports .component | toJson -}}
{{- end -}}
{{- define "meshserve.grpcPort" -}}{{ index (include "meshserve.ports" . | fromJsonArray) 0 }}{{- end -}}
{{- define "meshserve.metricsPort" -}}{{ index (include "meshserve.ports" . | fromJsonArray) 1 }}{{- end -}}

{{- define "meshserve.address" -}}
{{- printf "%s:%s" (include "meshserve.name" .) (include "meshserve.grpcPort" .) -}}
{{- end -}}

{{- define "meshserve.otlpEndpoint" -}}
{{- if .Values.tracing.otlpEndpoint -}}
{{- .Values.tracing.otlpEndpoint -}}
{{- else if .Values.tracing.collector.enabled -}}
{{- include "meshserve.address" (dict "root" . "component" "otel-collector") -}}
{{- end -}}
{{- end -}}

{{/* The bundled Valkey's password: redis.bundled.password, else the one the release's Secret
already holds (lookup: an upgrade keeps it), else 32 random characters. Computed once per render
and kept in the values, so that every template that includes it sees the same one. */}}
{{- define "meshserve.redisPassword" -}}
{{- $r := .Values.redis.bundled -}}
{{- if not $r.password -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "meshserve.name" (dict "root" . "component" "redis")) -}}
{{- $kept := dig "data" "password" "" ($existing | default dict) -}}
{{- $_ := set $r "password" (ternary ($kept | b64dec) (randAlphaNum 32) (ne $kept "")) -}}
{{- else if not (regexMatch "^[A-Za-z0-9._~-]{16,}$" $r.password) -}}
{{- fail "redis.bundled.password must be at least 16 characters of letters, digits and . _ ~ - (it goes into a URL and Valkey's config unquoted)" -}}
{{- end -}}
{{- $r.password -}}
{{- end -}}

{{/* The Redis URL the cache and the gateways read: in the release's Redis Secret (redis.yaml),
from which their MESHSERVE_REDIS_URL comes. */}}
{{- define "meshserve.redisUrl" -}}
{{- if .Values.redis.url -}}
{{- .Values.redis.url -}}
{{- else -}}
{{- printf "redis://:%s@%s/0" (include "meshserve.redisPassword" .) (include "meshserve.address" (dict "root" . "component" "redis")) -}}
{{- end -}}
{{- end -}}

{{/* The container env that carries the Redis URL: a Secret, never the command line. */}}
{{- define "meshserve.redisEnv" -}}
- name: MESHSERVE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "meshserve.name" (dict "root" . "component" "redis") }}
      key: url
{{- end -}}

{{/* "true" when KEDA scales the workers: asked for, and the cluster serves KEDA's API. */}}
{{/* The model a request naming none runs on: the first worker group's (the gateways' --model). */}}
{{- define "meshserve.defaultModel" -}}
{{- (index (include "meshserve.workerGroups" . | fromJsonArray) 0).model.servedName -}}
{{- end -}}

{{/* "true" where KEDA scales a worker group (.root, .autoscaling: the group's settings). */}}
{{- define "meshserve.kedaScalesWorkers" -}}
{{- if and .autoscaling.enabled (.root.Capabilities.APIVersions.Has "keda.sh/v1alpha1") }}true{{ end -}}
{{- end -}}

{{/* The flags every meshserve service takes (ServerConfig). */}}
{{- define "meshserve.serverArgs" -}}
- --host
- 0.0.0.0
- --port
- {{ include "meshserve.grpcPort" . | quote }}
- --metrics-port
- {{ include "meshserve.metricsPort" . | quote }}
- --log-level
- {{ .root.Values.logLevel }}
- --otlp-endpoint
- {{ include "meshserve.otlpEndpoint" .root | quote }}
- --trace-sampling-ratio
- {{ .root.Values.tracing.samplingRatio | quote }}
{{- if .root.Values.meshTls.enabled }}
- --mesh-tls-dir
- {{ include "meshserve.meshTlsPath" . }}
{{- end }}
{{- end -}}

{{/* Mutual TLS inside the mesh (mesh-tls.yaml): each component's certificate is a TLS Secret
(tls.crt, tls.key, ca.crt: the mesh CA), mounted here. The identity is the certificate's common
name and DNS name: what its callers check it for, and whom a gateway (the edge) and the cache
(a gateway) take a tenant from. */}}
{{- define "meshserve.meshTlsPath" -}}/etc/meshserve/mesh-tls{{- end -}}
{{- define "meshserve.meshTlsIdentity" -}}meshserve-{{ .component }}{{- end -}}
{{- define "meshserve.meshTlsSecret" -}}
{{- include "meshserve.name" (dict "root" .root "component" (printf "mesh-tls-%s" .component)) -}}
{{- end -}}
{{- define "meshserve.meshTlsMount" -}}
{{- if .root.Values.meshTls.enabled }}
- name: mesh-tls
  mountPath: {{ include "meshserve.meshTlsPath" . }}
  readOnly: true
{{- end }}
{{- end -}}
{{- define "meshserve.meshTlsVolume" -}}
{{- if .root.Values.meshTls.enabled }}
- name: mesh-tls
  secret:
    secretName: {{ include "meshserve.meshTlsSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "meshserve.podAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ include "meshserve.metricsPort" . | quote }}
prometheus.io/path: /metrics
{{- end -}}

{{/* Pod spec parts every component shares; .values: the component's own values (where its
pods may run: nodeSelector, tolerations, affinity). */}}
{{- define "meshserve.podCommon" -}}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .root.Values.topologySpread }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "meshserve.selectorLabels" . | nindent 8 }}
{{- end }}
{{- end -}}

{{/* gRPC probes on the service's own health service (services/server.py sets it SERVING). */}}
{{/* Kubernetes' own gRPC probe cannot present a certificate: under mutual TLS the pod asks
itself with `meshserve health`, presenting its own. */}}
{{- define "meshserve.grpcProbe" -}}
{{- if .root.Values.meshTls.enabled -}}
exec:
  command: [meshserve, health, "127.0.0.1:{{ include "meshserve.grpcPort" . }}", --mesh-tls-dir, {{ include "meshserve.meshTlsPath" . }}, --peer, {{ include "meshserve.meshTlsIdentity" . }}]
{{- else -}}
grpc: {port: {{ include "meshserve.grpcPort" . }}}
{{- end -}}
{{- end -}}

{{- define "meshserve.grpcProbes" -}}
startupProbe:
  {{- include "meshserve.grpcProbe" . | nindent 2 }}
  periodSeconds: 5
  failureThreshold: {{ .startupFailures | default 60 }}
readinessProbe:
  {{- include "meshserve.grpcProbe" . | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  {{- include "meshserve.grpcProbe" . | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}

{{- define "meshserve.containerPorts" -}}
ports:
  - name: grpc
    containerPort: {{ include "meshserve.grpcPort" . }}
  {{- if ne (include "meshserve.metricsPort" .) "0" }}
  - name: metrics
    containerPort: {{ include "meshserve.metricsPort" . }}
  {{- end }}
{{- end -}}

{{- define "meshserve.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "meshserve.name" . }}
  labels:
    {{- include "meshserve.labels" . | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      {{- include "meshserve.selectorLabels" . | nindent 6 }}
{{- end -}}

{{- define "meshserve.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "meshserve.name" . }}
  labels:
    {{- include "meshserve.labels" . | nindent 4 }}
spec:
  {{- if .headless }}
  clusterIP: None
  {{- end }}
  selector:
    {{- include "meshserve.selectorLabels" . | nindent 4 }}
  ports:
    - name: grpc
      port: {{ include "meshserve.grpcPort" . }}
      targetPort: grpc
      appProtocol: grpc
{{- end -}}

{{/* apiKeys.keys as MESHSERVE_API_KEYS reads them: KEY=TENANT,KEY=TENANT. Refuses a key shorter
than 32 characters (128 bits of a hex key: beyond guessing at any request rate) or one holding a
separator, and a tenant Envoy would refuse; messages name the tenant, never the key. */}}
{{- define "meshserve.apiKeys" -}}
{{- $pairs := list -}}
{{- range $key, $tenant := .Values.apiKeys.keys -}}
{{- if not (regexMatch "^[A-Za-z0-9_.:-]{1,64}$" (toString $tenant)) -}}
{{- fail (printf "apiKeys.keys: tenant %q must be 1 to 64 letters, digits or _ . : -" (toString $tenant)) -}}
{{- end -}}
{{- if lt (len $key) 32 -}}
{{- fail (printf "apiKeys.keys: the key of tenant %q has %d characters; a key needs at least 32 (openssl rand -hex 24 makes one)" $tenant (len $key)) -}}
{{- end -}}
{{- if regexMatch "[\\s,=#]" $key -}}
{{- fail (printf "apiKeys.keys: the key of tenant %q holds a space, ',', '=' or '#', which the key list uses as separators" $tenant) -}}
{{- end -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $tenant) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* "true" when Envoy checks API keys. Without keys the render fails, unless allowAnonymous. */}}
{{- define "meshserve.auth" -}}
{{- $k := .Values.apiKeys -}}
{{- if and $k.keys $k.existingSecret -}}
{{- fail "apiKeys.keys and apiKeys.existingSecret are both set: the chart makes the Secret from the keys, or reads yours; choose one" -}}
{{- end -}}
{{- if or $k.keys $k.existingSecret -}}
true
{{- else if not .Values.allowAnonymous -}}
{{- fail "API keys are required: set apiKeys.keys (KEY: TENANT, each key at least 32 characters) or apiKeys.existingSecret (a Secret you made), or set allowAnonymous=true to serve without authentication" -}}
{{- end -}}
{{- end -}}

{{/* What rolls Envoy when its keys change (it reads them once, at start): the keys themselves,
or the existing Secret's data where the render sees the cluster (helm install/upgrade), and
rolloutToken for renders that do not (helm template, Argo CD). */}}
{{- define "meshserve.apiKeysChecksum" -}}
{{- $k := .Values.apiKeys -}}
{{- $source := include "meshserve.apiKeys" . -}}
{{- if $k.existingSecret -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace $k.existingSecret | default dict -}}
{{- $source = dig "data" $k.secretKey "" $secret -}}
{{- end -}}
{{- printf "%s\n%s\n%s" $k.existingSecret $source $k.rolloutToken | sha256sum -}}
{{- end -}}

{{/* "true" when every gateway picks in its own process (router.mode: embedded), "" for the router
service; any other mode fails the render with the valid choices. */}}
{{- define "meshserve.routerEmbedded" -}}
{{- $mode := .Values.router.mode | default "service" -}}
{{- if not (has $mode (list "service" "embedded")) -}}
{{- fail (printf "router.mode must be service or embedded, not %q" $mode) -}}
{{- end -}}
{{- if eq $mode "embedded" }}true{{ end -}}
{{- end -}}

{{/* The routing flags, the router's or (router.mode embedded) every gateway's: the policy, and
the workers found through the Kubernetes API (their headless Service's EndpointSlices). */}}
{{- define "meshserve.routingArgs" -}}
- --routing
- {{ .Values.router.routing }}
- --discovery
- kubernetes
- --kubernetes-service
- {{ include "meshserve.name" (dict "root" . "component" "worker") }}
- --kubernetes-port
- grpc
{{- with .Values.router.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end -}}
