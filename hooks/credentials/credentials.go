// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package credentials wires PostgreSQL and MySQL credential Secrets to the agent's RBAC. It snapshots which
// Secrets the ServiceWithHealthchecks resources reference and which credential Secrets exist
// (metadata and key names only, never values), and writes the internal values the templates
// turn into Roles with resourceNames: the agent may read exactly the referenced credential
// Secrets and nothing else. Referenced Secrets that are missing or malformed are reported in
// values, in the hook's log and as metrics.
package credentials

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/deckhouse/module-sdk/pkg"
	objectpatch "github.com/deckhouse/module-sdk/pkg/object-patch"
	"github.com/deckhouse/module-sdk/pkg/registry"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// Snapshot names and values paths.
const (
	// SnapshotResources holds the credential references of every ServiceWithHealthchecks.
	SnapshotResources = "resources"
	// SnapshotSecrets holds the credential Secrets (type network.deckhouse.io/postgresql-credentials).
	SnapshotSecrets = "credential_secrets"
	// SnapshotMySQLSecrets holds the MySQL credential Secrets (type
	// network.deckhouse.io/mysql-credentials).
	SnapshotMySQLSecrets = "mysql_credential_secrets"

	// ValuesSecrets is where the Secrets the agent may read are written, grouped by namespace.
	ValuesSecrets = "serviceWithHealthchecks.internal.credentialSecrets"
	// ValuesProblems is where the report of unusable references is written.
	ValuesProblems = "serviceWithHealthchecks.internal.credentialProblems"

	// MetricGroup is the metric group of the problem gauge; it is expired on every run.
	MetricGroup = "d8_service_with_healthchecks_credentials"
	// MetricProblem is 1 for each referenced credential Secret that cannot be used.
	MetricProblem = "d8_service_with_healthchecks_credential_secret_problem"
)

// Problem kinds.
const (
	// ProblemMissing: no Secret of the credential type has the referenced name (it is absent or
	// of another type; the agent is not allowed to read Secrets of other types).
	ProblemMissing = "Missing"
	// ProblemMalformed: the Secret has the credential type but lacks required keys.
	ProblemMalformed = "Malformed"
)

// TLSModes are the values the tlsMode key may hold.
var TLSModes = []string{"Disabled", "SkipVerification", "VerifyCA", "VerifyAll"}

// ResourcesFilter reduces a ServiceWithHealthchecks to its namespace, name and the sorted,
// unique names of the Secrets its PostgreSQL probes reference, and those its MySQL probes do.
const ResourcesFilter = `{
  namespace: .metadata.namespace,
  name: .metadata.name,
  uid: .metadata.uid,
  secrets: ([.spec.healthcheck.probes[]? | .postgreSQL.authSecretName? // empty | select(. != "")] | unique),
  mySQLSecrets: ([.spec.healthcheck.probes[]? | .mySQL.authSecretName? // empty | select(. != "")] | unique)
}`

// SecretsFilter reduces a credential Secret to its namespace, name, the names of its keys and
// whether its tlsMode (when set) is a known mode. The values never leave the filter.
var SecretsFilter = `{
  namespace: .metadata.namespace,
  name: .metadata.name,
  type: .type,
  keys: (((.data // {}) | keys) + ((.stringData // {}) | keys) | unique),
  tlsModeKnown: (((.data.tlsMode // null) | if . == null then true else (@base64d | IN(` +
	quoteList(TLSModes) + `)) end))
}`

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = `"` + v + `"`
	}
	return strings.Join(q, ", ")
}

// Resource is the filtered snapshot of a ServiceWithHealthchecks.
type Resource struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	UID       string   `json:"uid,omitempty"`
	Secrets   []string `json:"secrets"`
	// MySQLSecrets are the Secrets its MySQL probes reference.
	MySQLSecrets []string `json:"mySQLSecrets,omitempty"`
}

// Secret is the filtered snapshot of a credential Secret.
type Secret struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Type is the Secret's type; empty stands for the PostgreSQL one.
	Type         string   `json:"type,omitempty"`
	Keys         []string `json:"keys"`
	TLSModeKnown bool     `json:"tlsModeKnown"`
}

// NamespaceSecrets are the credential Secrets of one namespace the agent may read.
type NamespaceSecrets struct {
	Namespace string   `json:"namespace"`
	Names     []string `json:"names"`
}

// Problem is a referenced credential Secret that cannot be used.
type Problem struct {
	Namespace    string   `json:"namespace"`
	Name         string   `json:"name"`
	Kind         string   `json:"kind"`
	Message      string   `json:"message"`
	ReferencedBy []string `json:"referencedBy"`
	// ReferencedByMore counts the resources that reference it beyond those ReferencedBy lists
	// (at most MaxReferencedBy).
	ReferencedByMore int `json:"referencedByMore,omitempty"`
}

// Config subscribes to the resources and the credential Secrets. Every change of either
// recomputes the values; the hook also runs before every Helm render.
var Config = &pkg.HookConfig{
	OnBeforeHelm: &pkg.OrderedConfig{Order: 10},
	Queue:        "/modules/service-with-healthchecks/credentials",
	Kubernetes: []pkg.KubernetesConfig{
		{
			Name:       SnapshotResources,
			APIVersion: "network.deckhouse.io/v1alpha1",
			Kind:       "ServiceWithHealthchecks",
			JqFilter:   ResourcesFilter,
		},
		{
			Name:       SnapshotSecrets,
			APIVersion: "v1",
			Kind:       "Secret",
			FieldSelector: &pkg.FieldSelector{MatchExpressions: []pkg.FieldSelectorRequirement{
				{Field: "type", Operator: "Equals", Value: wellknown.SecretTypePostgreSQLCredentials},
			}},
			JqFilter: SecretsFilter,
		},
		{
			Name:       SnapshotMySQLSecrets,
			APIVersion: "v1",
			Kind:       "Secret",
			FieldSelector: &pkg.FieldSelector{MatchExpressions: []pkg.FieldSelectorRequirement{
				{Field: "type", Operator: "Equals", Value: wellknown.SecretTypeMySQLCredentials},
			}},
			JqFilter: SecretsFilter,
		},
	},
}

var _ = registry.RegisterFunc(Config, Handle)

// metricGroup puts a metric into MetricGroup.
type metricGroup string

func (g metricGroup) Apply(o pkg.MetricCollectorOptionApplier) { o.WithGroup(string(g)) }

// Handle computes the values from the snapshots.
func Handle(_ context.Context, input *pkg.HookInput) error {
	resources, err := objectpatch.UnmarshalToStruct[Resource](input.Snapshots, SnapshotResources)
	if err != nil {
		return fmt.Errorf("reading the %s snapshot: %w", SnapshotResources, err)
	}
	secrets, err := objectpatch.UnmarshalToStruct[Secret](input.Snapshots, SnapshotSecrets)
	if err != nil {
		return fmt.Errorf("reading the %s snapshot: %w", SnapshotSecrets, err)
	}
	mySQLSecrets, err := objectpatch.UnmarshalToStruct[Secret](input.Snapshots, SnapshotMySQLSecrets)
	if err != nil {
		return fmt.Errorf("reading the %s snapshot: %w", SnapshotMySQLSecrets, err)
	}
	secrets = append(secrets, mySQLSecrets...)

	readable, problems := Compute(resources, secrets)
	// The resources are told what the values cannot hold (Events), before the problems
	// themselves are bounded.
	for _, e := range OverLimitEvents(resources, problems, now()) {
		input.PatchCollector.CreateOrUpdate(e)
	}
	problems, omitted := BoundProblems(problems)
	input.Values.Set(ValuesSecrets, readable)
	input.Values.Set(ValuesProblems, problems)

	input.MetricsCollector.Expire(MetricGroup)
	for ns, n := range overLimitByNamespace(problems, omitted) {
		input.MetricsCollector.Set(MetricOverLimit, float64(n), map[string]string{"namespace": ns}, metricGroup(MetricGroup))
	}
	if omitted.total > 0 {
		input.Logger.Warn("more credential problems than the values hold: only the first are listed",
			"listed", len(problems), "omitted", omitted.total)
	}
	for _, p := range problems {
		input.MetricsCollector.Set(MetricProblem, 1, map[string]string{
			"namespace": p.Namespace, "name": p.Name, "problem": p.Kind,
		}, metricGroup(MetricGroup))
		input.Logger.Warn("credential secret cannot be used",
			"namespace", p.Namespace, "name", p.Name, "problem", p.Kind, "reason", p.Message)
	}
	return nil
}

// secretKey is a reference to a credential Secret of a type.
type secretKey struct{ namespace, name, typ string }

// references maps every referenced credential Secret, with the type its probes need, to the
// resources that reference it.
func references(resources []Resource) map[secretKey][]string {
	referencedBy := map[secretKey][]string{}
	for _, r := range resources {
		for _, s := range r.Secrets {
			k := secretKey{r.Namespace, s, wellknown.SecretTypePostgreSQLCredentials}
			referencedBy[k] = append(referencedBy[k], r.Name)
		}
		for _, s := range r.MySQLSecrets {
			k := secretKey{r.Namespace, s, wellknown.SecretTypeMySQLCredentials}
			referencedBy[k] = append(referencedBy[k], r.Name)
		}
	}
	return referencedBy
}

// Compute decides which credential Secrets the agent may read (referenced by a resource of the
// same namespace and existing with the credential type its probes need) and reports the
// references that cannot be used. Both results are sorted so that the values, and so the
// rendered Roles, are stable.
func Compute(resources []Resource, secrets []Secret) ([]NamespaceSecrets, []Problem) {
	referencedBy := references(resources)
	existing := make(map[secretKey]Secret, len(secrets))
	for _, s := range secrets {
		typ := s.Type
		if typ == "" {
			typ = wellknown.SecretTypePostgreSQLCredentials
		}
		existing[secretKey{s.Namespace, s.Name, typ}] = s
	}

	byNamespace := map[string][]string{}
	problems := []Problem{}
	for k, refs := range referencedBy {
		sort.Strings(refs)
		refs = slices.Compact(refs)
		s, ok := existing[k]
		if !ok {
			problems = append(problems, Problem{
				Namespace: k.namespace, Name: k.name, Kind: ProblemMissing, ReferencedBy: refs,
				Message: fmt.Sprintf("no Secret %q of type %s in namespace %q (it is absent or has another type)",
					k.name, k.typ, k.namespace),
			})
			continue
		}
		if !slices.Contains(byNamespace[k.namespace], k.name) {
			byNamespace[k.namespace] = append(byNamespace[k.namespace], k.name)
		}
		if msg := Malformed(s); msg != "" {
			problems = append(problems, Problem{
				Namespace: k.namespace, Name: k.name, Kind: ProblemMalformed, ReferencedBy: refs, Message: msg,
			})
		}
	}

	kept, over := boundReadable(byNamespace)
	byNamespace = kept
	for _, k := range over {
		problems = append(problems, Problem{
			Namespace: k.namespace, Name: k.name, Kind: ProblemOverLimit, ReferencedBy: compactRefs(referencedBy, k.namespace, k.name),
			Message: fmt.Sprintf("the module grants the agent at most %d credential Secrets per namespace and %d in all (their names are Helm values): "+
				"the agent may not read Secret %q, and the probes that use it fail until fewer are referenced", MaxSecretsPerNamespace, MaxSecrets, k.name),
		})
	}

	readable := make([]NamespaceSecrets, 0, len(byNamespace))
	for ns, names := range byNamespace {
		sort.Strings(names)
		readable = append(readable, NamespaceSecrets{Namespace: ns, Names: names})
	}
	sort.Slice(readable, func(i, j int) bool { return readable[i].Namespace < readable[j].Namespace })
	sort.Slice(problems, func(i, j int) bool {
		if problems[i].Namespace != problems[j].Namespace {
			return problems[i].Namespace < problems[j].Namespace
		}
		if problems[i].Name != problems[j].Name {
			return problems[i].Name < problems[j].Name
		}
		return problems[i].Message < problems[j].Message
	})
	return readable, problems
}

// Malformed describes what is wrong with a credential Secret as far as its key names and the
// filter's tlsMode check can tell, or returns "" when nothing is. The admission policy rejects
// such Secrets when they are written; this catches the ones written before it was in force.
func Malformed(s Secret) string {
	var reasons []string
	if !slices.Contains(s.Keys, "user") {
		reasons = append(reasons, "the key user is missing")
	}
	if !s.TLSModeKnown {
		reasons = append(reasons, "tlsMode is not one of "+strings.Join(TLSModes, ", "))
	}
	hasCert, hasKey := slices.Contains(s.Keys, "clientCert"), slices.Contains(s.Keys, "clientKey")
	if hasCert != hasKey {
		reasons = append(reasons, "clientCert and clientKey must be set together")
	}
	return strings.Join(reasons, "; ")
}
