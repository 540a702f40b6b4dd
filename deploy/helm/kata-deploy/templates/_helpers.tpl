{{- define "kata-deploy.name" -}}kata-deploy{{- end -}}
{{- define "kata-deploy.labels" -}}
app.kubernetes.io/name: {{ include "kata-deploy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "kata-deploy.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag }}{{- end -}}
