{{/*
Labels every object of the release carries, besides its own app.kubernetes.io/name (which is
also its Pods' selector, the same as in deploy/: an object installed from deploy/ and one from the
chart select the same Pods).
*/}}
{{- define "kpr.labels" -}}
app.kubernetes.io/part-of: kpr
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The image of every container. */}}
{{- define "kpr.image" -}}
image: {{ printf "%s:%s" .Values.image.repository (toString .Values.image.tag) | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end }}

{{/*
Whether the controller-manager runs the controller named by `name` with the list `controllers`:
named, or `*` without `-name`. Prints "true" or nothing.
*/}}
{{- define "kpr.runs" -}}
{{- $list := .controllers -}}
{{- if or (has .name $list) (and (has "*" $list) (not (has (printf "-%s" .name) $list))) -}}
true
{{- end -}}
{{- end }}

{{/* The agent's backend, checked. */}}
{{- define "kpr.backend" -}}
{{- $backends := list "userspace" "iptables" "nftables" "ebpf" -}}
{{- if not (has .Values.agent.backend $backends) -}}
{{- fail (printf "agent.backend: %q is not a kpr backend (userspace, iptables, nftables, ebpf)" (toString .Values.agent.backend)) -}}
{{- end -}}
{{- .Values.agent.backend -}}
{{- end }}
