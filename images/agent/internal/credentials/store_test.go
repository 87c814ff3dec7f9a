// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package credentials_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
	"github.com/deckhouse/service-with-healthchecks/testkit/pki"
)

var env *controlplane.Env

func TestMain(m *testing.M) { controlplane.Main(m, controlplane.Options{}, &env) }

const (
	agentSA = "agent"
	wait    = 30 * time.Second
	tick    = 50 * time.Millisecond
)

// agentStore returns a store that acts as the agent's service account, whose Role may read only
// the Secrets named in resourceNames.
func agentStore(t *testing.T, ns string, resourceNames ...string) (*credentials.Store, kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-credentials", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"secrets"},
			Verbs: []string{"get", "list", "watch"}, ResourceNames: resourceNames,
		}},
	}
	require.NoError(t, env.Client.Create(ctx, role))
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-credentials", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: agentSA}},
	}
	require.NoError(t, env.Client.Create(ctx, binding))
	cs, err := kubernetes.NewForConfig(env.ServiceAccountConfig(ns, agentSA))
	require.NoError(t, err)
	s := credentials.NewStore(cs, credentials.Options{})
	t.Cleanup(s.Stop)
	return s, cs
}

func secret(ns, name string, typ corev1.SecretType, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Type:       typ,
		Data:       map[string][]byte{},
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func TestStoreReadsOnlyReferencedSecretsAsTheAgent(t *testing.T) {
	ctx := t.Context()
	ns := env.CreateNamespaceForTest(t, "creds")
	require.NoError(t, env.Client.Create(ctx, secret(ns, "db-creds", wellknown.SecretTypePostgreSQLCredentials,
		map[string]string{"user": "app", "password": "pw-db-creds", "tlsMode": "Disabled"})))
	require.NoError(t, env.Client.Create(ctx, secret(ns, "unreferenced", wellknown.SecretTypePostgreSQLCredentials,
		map[string]string{"user": "other", "password": "pw-unreferenced"})))
	store, cs := agentStore(t, ns, "db-creds")

	store.SetReferences([]types.NamespacedName{{Namespace: ns, Name: "db-creds"}})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		creds, err := store.Lookup(ns, "db-creds")
		require.NoError(c, err)
		assert.Equal(c, "app", creds.User)
		assert.Equal(c, "pw-db-creds", creds.Password())
		assert.Equal(c, credentials.TLSDisabled, creds.TLSMode)
	}, wait, tick, "the agent reads the Secret its Role names")

	_, err := cs.CoreV1().Secrets(ns).Get(ctx, "unreferenced", metav1.GetOptions{})
	require.True(t, apierrors.IsForbidden(err), "reading an unreferenced Secret must be Forbidden, got %v", err)
	_, err = cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "listing the namespace's Secrets must be Forbidden, got %v", err)
	_, err = cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "listing all Secrets must be Forbidden, got %v", err)

	// The store asked for a Secret the Role does not name: it says so instead of hanging.
	store.SetReferences([]types.NamespacedName{{Namespace: ns, Name: "db-creds"}, {Namespace: ns, Name: "unreferenced"}})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := store.Lookup(ns, "unreferenced")
		assert.ErrorContains(c, err, "credentials Secret "+ns+"/unreferenced: cannot be read: Forbidden")
	}, wait, tick)
	creds, err := store.Lookup(ns, "db-creds")
	require.NoError(t, err, "the permitted Secret is still served")
	require.Equal(t, "app", creds.User)

	// Dropping a reference stops its watch.
	store.SetReferences([]types.NamespacedName{{Namespace: ns, Name: "unreferenced"}})
	require.ElementsMatch(t, []types.NamespacedName{{Namespace: ns, Name: "unreferenced"}}, store.References())
	_, err = store.Lookup(ns, "db-creds")
	require.EqualError(t, err, "credentials Secret "+ns+"/db-creds: not referenced by any probe (no watch)")
}

func TestStoreReportsBrokenSecretsAndHealsWhenFixed(t *testing.T) {
	ca, err := pki.NewCA("creds-ca")
	require.NoError(t, err)
	client, err := ca.Client("app")
	require.NoError(t, err)
	other, err := ca.Client("other")
	require.NoError(t, err)
	typ := corev1.SecretType(wellknown.SecretTypePostgreSQLCredentials)

	cases := map[string]struct {
		secret  func(ns string) *corev1.Secret // nil: the Secret does not exist yet
		problem string
	}{
		"a missing Secret is reported as not found": {
			problem: "not found",
		},
		"a Secret of another type is reported as wrong type, not missing": {
			secret: func(ns string) *corev1.Secret {
				return secret(ns, "db", corev1.SecretTypeOpaque, map[string]string{"user": "app", "password": "pw"})
			},
			problem: `wrong type "Opaque", want network.deckhouse.io/postgresql-credentials or network.deckhouse.io/mysql-credentials`,
		},
		"a Secret without user names the missing key": {
			secret:  func(ns string) *corev1.Secret { return secret(ns, "db", typ, map[string]string{"password": "pw"}) },
			problem: "key user missing",
		},
		"an unknown tlsMode is rejected": {
			secret: func(ns string) *corev1.Secret {
				return secret(ns, "db", typ, map[string]string{"user": "app", "tlsMode": "Sometimes"})
			},
			problem: `key tlsMode: "Sometimes" is not one of Disabled, SkipVerification, VerifyCA, VerifyAll`,
		},
		"VerifyCA without caCert is rejected": {
			secret: func(ns string) *corev1.Secret {
				return secret(ns, "db", typ, map[string]string{"user": "app", "tlsMode": "VerifyCA"})
			},
			problem: "key caCert missing (required for tlsMode VerifyCA)",
		},
		"a caCert that is not PEM is rejected": {
			secret: func(ns string) *corev1.Secret {
				return secret(ns, "db", typ, map[string]string{"user": "app", "tlsMode": "VerifyAll", "caCert": "not a certificate"})
			},
			problem: "key caCert: no PEM certificate found",
		},
		"a client certificate without its key is rejected": {
			secret: func(ns string) *corev1.Secret {
				return secret(ns, "db", typ, map[string]string{"user": "app", "tlsMode": "SkipVerification", "clientCert": string(client.CertPEM)})
			},
			problem: "keys clientCert and clientKey must be set together",
		},
		"a client key that does not match the certificate is rejected": {
			secret: func(ns string) *corev1.Secret {
				return secret(ns, "db", typ, map[string]string{"user": "app", "tlsMode": "SkipVerification",
					"clientCert": string(client.CertPEM), "clientKey": string(other.KeyPEM)})
			},
			problem: "keys clientCert and clientKey: tls: private key does not match public key",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			ns := env.CreateNamespaceForTest(t, "creds")
			store, _ := agentStore(t, ns, "db")
			if tc.secret != nil {
				require.NoError(t, env.Client.Create(ctx, tc.secret(ns)))
			}
			store.SetReferences([]types.NamespacedName{{Namespace: ns, Name: "db"}})
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				_, err := store.Lookup(ns, "db")
				assert.EqualError(c, err, "credentials Secret "+ns+"/db: "+tc.problem)
			}, wait, tick)

			// Fixing the Secret heals the store without a restart.
			fixed := secret(ns, "db", typ, map[string]string{"user": "app", "password": "pw-fixed",
				"tlsMode": "VerifyAll", "caCert": string(ca.CertPEM),
				"clientCert": string(client.CertPEM), "clientKey": string(client.KeyPEM)})
			if tc.secret == nil {
				require.NoError(t, env.Client.Create(ctx, fixed))
			} else {
				old := tc.secret(ns)
				if old.Type != fixed.Type {
					// The type of a Secret is immutable: replace it.
					require.NoError(t, env.Client.Delete(ctx, old))
					require.NoError(t, env.Client.Create(ctx, fixed))
				} else {
					require.NoError(t, env.Client.Update(ctx, fixed))
				}
			}
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				creds, err := store.Lookup(ns, "db")
				require.NoError(c, err)
				assert.Equal(c, "pw-fixed", creds.Password())
				assert.Equal(c, credentials.TLSVerifyAll, creds.TLSMode)
				assert.NotNil(c, creds.RootCAs)
				assert.NotNil(c, creds.ClientCertificate)
			}, wait, tick, "the fixed Secret is used")

			// Deleting it is noticed too.
			require.NoError(t, env.Client.Delete(ctx, fixed))
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				_, err := store.Lookup(ns, "db")
				assert.EqualError(c, err, "credentials Secret "+ns+"/db: not found")
			}, wait, tick)
		})
	}
}

func TestCredentialsNeverPrintThePassword(t *testing.T) {
	creds, err := credentials.Parse(secret("ns", "db", wellknown.SecretTypePostgreSQLCredentials,
		map[string]string{"user": "app", "password": "hunter2-secret"}))
	require.NoError(t, err)
	require.Equal(t, "hunter2-secret", creds.Password(), "the password is there to be hidden")
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		assert.NotContains(t, fmt.Sprintf(format, creds), "hunter2-secret", format)
	}
}
