{{- /*
Own helpers with the meaning of the Deckhouse helper chart (lib-helm), which cannot be
downloaded here. Values of this module live under .Values.serviceWithHealthchecks.
*/ -}}

{{- /* The module's name and namespace. */ -}}
{{- define "swh.name" -}}service-with-healthchecks{{- end -}}
{{- define "swh.namespace" -}}d8-service-with-healthchecks{{- end -}}

{{- /* Module labels: usage include "swh.labels" (dict "app" "controller"); the app is optional. */ -}}
{{- define "swh.labels" -}}
heritage: deckhouse
module: {{ include "swh.name" . }}
{{- if and (kindIs "map" .) (hasKey . "app") }}
app: {{ .app }}
{{- end }}
{{- end -}}

{{- /*
Image reference of one of the module's images: include "swh.image" (list . "controller").
The digest comes from global.modulesImages.digests.serviceWithHealthchecks.<image>, the
registry from serviceWithHealthchecks.registry.base when set, else global.modulesImages.registry.base.
*/ -}}
{{- define "swh.image" -}}
{{- $ctx := index . 0 -}}
{{- $image := index . 1 -}}
{{- include "swh.imageOf" (list $ctx "serviceWithHealthchecks" $image) -}}
{{- end -}}

{{- /* Image reference of a shared platform image: include "swh.commonImage" (list . "kubeRbacProxy"). */ -}}
{{- define "swh.commonImage" -}}
{{- $ctx := index . 0 -}}
{{- $image := index . 1 -}}
{{- include "swh.imageOf" (list $ctx "common" $image) -}}
{{- end -}}

{{- define "swh.imageOf" -}}
{{- $ctx := index . 0 -}}
{{- $module := index . 1 -}}
{{- $image := index . 2 -}}
{{- $digest := dig "modulesImages" "digests" $module $image "" ($ctx.Values.global | default dict) -}}
{{- if not $digest -}}
{{- fail (printf "no digest for image %s.%s in global.modulesImages.digests" $module $image) -}}
{{- end -}}
{{- $registry := dig "modulesImages" "registry" "base" "" ($ctx.Values.global | default dict) -}}
{{- $own := dig "registry" "base" "" ($ctx.Values.serviceWithHealthchecks | default dict) -}}
{{- if and $own (eq $module "serviceWithHealthchecks") -}}
{{- $registry = $own -}}
{{- end -}}
{{- if not $registry -}}
{{- fail "global.modulesImages.registry.base is not set" -}}
{{- end -}}
{{- printf "%s@%s" $registry $digest -}}
{{- end -}}

{{- /*
Node selector by strategy: include "swh.nodeSelector" (list . "system").
  system   - nodes labelled node-role.deckhouse.io/system when the cluster has any, else any node;
  master   - control-plane nodes;
  any-node - no selector.
Prints nothing when there is no selector.
*/ -}}
{{- define "swh.nodeSelector" -}}
{{- $ctx := index . 0 -}}
{{- $strategy := index . 1 -}}
{{- if eq $strategy "system" -}}
{{- if gt (int (dig "discovery" "d8SpecificNodeCountByRole" "system" 0 ($ctx.Values.global | default dict))) 0 }}
nodeSelector:
  node-role.deckhouse.io/system: ""
{{- end }}
{{- else if eq $strategy "master" }}
nodeSelector:
  node-role.kubernetes.io/control-plane: ""
{{- else if ne $strategy "any-node" -}}
{{- fail (printf "unknown node selector strategy %q" $strategy) -}}
{{- end -}}
{{- end -}}

{{- /*
Tolerations by strategy: include "swh.tolerations" (list . "system").
  system   - the taints of system nodes;
  master   - the taints of control-plane nodes;
  any-node - every taint (for programs that must run on every node).
*/ -}}
{{- define "swh.tolerations" -}}
{{- $strategy := index . 1 -}}
tolerations:
{{- if eq $strategy "system" }}
- key: dedicated.deckhouse.io
  operator: Equal
  value: system
- key: dedicated
  operator: Equal
  value: system
{{- else if eq $strategy "master" }}
- key: node-role.kubernetes.io/control-plane
  operator: Exists
- key: node-role.kubernetes.io/master
  operator: Exists
{{- else if eq $strategy "any-node" }}
- operator: Exists
{{- else -}}
{{- fail (printf "unknown toleration strategy %q" $strategy) -}}
{{- end }}
{{- end -}}

{{- /* Priority class: include "swh.priorityClassName" "system-node-critical". */ -}}
{{- define "swh.priorityClassName" -}}
priorityClassName: {{ . }}
{{- end -}}

{{- /* Pod security context of every pod: non-root, default seccomp profile. */ -}}
{{- define "swh.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 64535
  runAsGroup: 64535
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- /* Container security context of every container: restricted, read-only root filesystem. */ -}}
{{- define "swh.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{- /* Program log level flag value: Info -> info. */ -}}
{{- define "swh.logLevel" -}}
{{- .Values.serviceWithHealthchecks.logLevel | default "Info" | lower -}}
{{- end -}}

{{- /* Whether a platform module is enabled: include "swh.moduleEnabled" (list . "vertical-pod-autoscaler-crd"). */ -}}
{{- define "swh.moduleEnabled" -}}
{{- $ctx := index . 0 -}}
{{- if has (index . 1) (dig "enabledModules" (list) ($ctx.Values.global | default dict)) -}}true{{- end -}}
{{- end -}}

{{- /*
kube-rbac-proxy sidecar: include "swh.kubeRbacProxy" (dict "ctx" . "port" 8443 "upstream" "127.0.0.1:8080" "resource" "deployments" "name" "controller").
It serves the program's metrics (bound to 127.0.0.1) over TLS on the pod's address to callers
allowed to get <resource>/prometheus-metrics <name> in the module namespace.
*/ -}}
{{- define "swh.kubeRbacProxy" -}}
- name: kube-rbac-proxy
  image: {{ include "swh.commonImage" (list .ctx "kubeRbacProxy") }}
  args:
  - "--secure-listen-address=$(KUBE_RBAC_PROXY_LISTEN_ADDRESS):{{ .port }}"
  - "--v=2"
  - "--logtostderr=true"
  - "--stale-cache-interval=1h30m"
  - "--livez-path=/livez"
  env:
  - name: KUBE_RBAC_PROXY_LISTEN_ADDRESS
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: KUBE_RBAC_PROXY_CONFIG
    value: |
      upstreams:
      - upstream: http://{{ .upstream }}/metrics
        path: /metrics
        authorization:
          resourceAttributes:
            namespace: {{ include "swh.namespace" . }}
            apiGroup: apps
            apiVersion: v1
            resource: {{ .resource }}
            subresource: prometheus-metrics
            name: {{ .name }}
  ports:
  - name: https-metrics
    containerPort: {{ .port }}
    protocol: TCP
  livenessProbe:
    httpGet:
      path: /livez
      port: {{ .port }}
      scheme: HTTPS
    periodSeconds: 10
  readinessProbe:
    httpGet:
      path: /livez
      port: {{ .port }}
      scheme: HTTPS
    periodSeconds: 10
  {{- include "swh.containerSecurityContext" . | nindent 2 }}
  resources:
    requests:
      cpu: 10m
      memory: 20Mi
      ephemeral-storage: 50Mi
    limits:
      memory: 64Mi
{{- end -}}
