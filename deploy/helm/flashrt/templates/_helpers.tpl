{{- define "flashrt.name" -}}flashrt{{- end -}}
{{- define "flashrt.fullname" -}}{{ printf "%s-flashrt" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "flashrt.labels" -}}
app.kubernetes.io/name: flashrt
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "flashrt.selector" -}}
app.kubernetes.io/name: flashrt
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "flashrt.image" -}}
{{- if .Values.image.digest }}{{ .Values.image.repository }}@{{ .Values.image.digest }}{{ else }}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{ end }}
{{- end -}}
{{- define "flashrt.runtimeImage" -}}
{{- if .Values.runtimeImage.digest }}{{ .Values.runtimeImage.repository }}@{{ .Values.runtimeImage.digest }}{{ else }}{{ .Values.runtimeImage.repository }}:{{ .Values.runtimeImage.tag | default .Chart.AppVersion }}{{ end }}
{{- end -}}
{{- define "flashrt.webhookService" -}}{{ include "flashrt.fullname" . }}-webhook{{- end -}}
{{- define "flashrt.tlsSecret" -}}{{ include "flashrt.fullname" . }}-webhook-tls{{- end -}}
{{- define "flashrt.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
