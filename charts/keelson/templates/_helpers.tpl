{{- define "keelson.labels" -}}
app.kubernetes.io/component: manager
app.kubernetes.io/name: keelson
{{- end }}
