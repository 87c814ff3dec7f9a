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
Image reference of one of the module's images: include "swh.image" (list . "controller"). Built
the three ways lib-helm's helm_lib_module_image builds it (development/PACKAGING.md, "Images"):
  1. module package values in the render context (.Module.Package, maps as lib-helm's own test
     passes them): <Package.Registry.repository>/<Package.Name>@<Package.Digests.<image>>;
  2. otherwise, an external module (serviceWithHealthchecks.registry.base set):
     <registry.base without surrounding slashes>/service-with-healthchecks@<digest>;
  3. otherwise (an embedded module): <global.modulesImages.registry.base>@<digest>;
digests in 2 and 3 from global.modulesImages.digests.serviceWithHealthchecks.<image>. Rendering
fails with a message naming what is missing.
*/ -}}
{{- define "swh.image" -}}
{{- $ctx := index . 0 -}}
{{- $image := index . 1 -}}
{{- $pkg := dict -}}
{{- if hasKey $ctx "Module" -}}
{{- $pkg = dig "Package" dict (index $ctx "Module" | default dict) -}}
{{- end -}}
{{- if $pkg -}}
{{- $repository := dig "Registry" "repository" "" $pkg -}}
{{- if not $repository -}}
{{- fail "Module.Package.Registry.repository is not set" -}}
{{- end -}}
{{- $name := dig "Name" "" $pkg -}}
{{- if not $name -}}
{{- fail "Module.Package.Name is not set" -}}
{{- end -}}
{{- $digest := dig "Digests" $image "" $pkg -}}
{{- if not $digest -}}
{{- fail (printf "no digest for image %s in Module.Package.Digests" $image) -}}
{{- end -}}
{{- printf "%s/%s@%s" $repository $name $digest -}}
{{- else -}}
{{- $global := $ctx.Values.global | default dict -}}
{{- $digest := dig "modulesImages" "digests" "serviceWithHealthchecks" $image "" $global -}}
{{- if not $digest -}}
{{- fail (printf "no digest for image serviceWithHealthchecks.%s in global.modulesImages.digests" $image) -}}
{{- end -}}
{{- $registry := dig "modulesImages" "registry" "base" "" $global -}}
{{- $own := dig "registry" "base" "" ($ctx.Values.serviceWithHealthchecks | default dict) -}}
{{- if $own -}}
{{- $registry = printf "%s/%s" (trimAll "/" $own) (include "swh.name" $ctx) -}}
{{- end -}}
{{- if not $registry -}}
{{- fail "global.modulesImages.registry.base is not set" -}}
{{- end -}}
{{- printf "%s@%s" $registry $digest -}}
{{- end -}}
{{- end -}}

{{- /*
Image reference of a shared platform image: include "swh.commonImage" (list . "kubeRbacProxy"),
<global.modulesImages.registry.base>@<global.modulesImages.digests.common.<image>>, whatever the
module's own registry is (lib-helm's helm_lib_module_common_image).
*/ -}}
{{- define "swh.commonImage" -}}
{{- $ctx := index . 0 -}}
{{- $image := index . 1 -}}
{{- $global := $ctx.Values.global | default dict -}}
{{- $digest := dig "modulesImages" "digests" "common" $image "" $global -}}
{{- if not $digest -}}
{{- fail (printf "no digest for image common.%s in global.modulesImages.digests" $image) -}}
{{- end -}}
{{- $registry := dig "modulesImages" "registry" "base" "" $global -}}
{{- if not $registry -}}
{{- fail "global.modulesImages.registry.base is not set" -}}
{{- end -}}
{{- printf "%s@%s" $registry $digest -}}
{{- end -}}

{{- /* Names of the registry Secrets (templates/registry-secret.yaml). */ -}}
{{- define "swh.moduleRegistrySecret" -}}{{ include "swh.name" . }}-module-registry{{- end -}}
{{- define "swh.platformRegistrySecret" -}}deckhouse-registry{{- end -}}

{{- /* imagePullSecrets of every pod: the registry Secrets that are rendered, none without any. */ -}}
{{- define "swh.imagePullSecrets" -}}
{{- $names := list -}}
{{- if dig "registry" "dockercfg" "" (.Values.serviceWithHealthchecks | default dict) -}}
{{- $names = append $names (include "swh.moduleRegistrySecret" .) -}}
{{- end -}}
{{- if dig "modulesImages" "registry" "dockercfg" "" (.Values.global | default dict) -}}
{{- $names = append $names (include "swh.platformRegistrySecret" .) -}}
{{- end -}}
{{- if $names }}
imagePullSecrets:
{{- range $names }}
- name: {{ . }}
{{- end }}
{{- end -}}
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
