// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

const (
	pemCert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\n-----END CERTIFICATE-----\n"
	pemKey  = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA\n-----END EC PRIVATE KEY-----\n"
	pemKey8 = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMG\n-----END PRIVATE KEY-----\n"
)

func credentialSecret(ns, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       wellknown.SecretTypePostgreSQLCredentials,
		Data:       map[string][]byte{},
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func TestAdmissionPolicyRejectsMalformedCredentialSecrets(t *testing.T) {
	objs := render(t, bundle.ValueSets()[bundle.SetDefaults])
	apply(t, objs, "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
	ns := env.CreateNamespaceForTest(t, "credentials")
	ctx := t.Context()

	// The policy takes a few seconds to be in force: poll with a Secret it must reject.
	probe := credentialSecret(ns, "probe", map[string]string{"password": "pw"})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := env.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		assert.True(c, apierrors.IsInvalid(err), "want the policy to reject, got %v", err)
	}, time.Minute, 200*time.Millisecond)

	cases := map[string]struct {
		data       map[string]string
		stringData map[string]string
		typ        corev1.SecretType
		wantErr    string
	}{
		"a Secret without user is rejected": {
			data:    map[string]string{"password": "pw"},
			wantErr: `needs a non-empty key "user"`,
		},
		"a Secret with an empty user is rejected": {
			data:    map[string]string{"user": "", "password": "pw"},
			wantErr: `needs a non-empty key "user"`,
		},
		"an unknown tlsMode is rejected": {
			data:    map[string]string{"user": "app", "tlsMode": "require"},
			wantErr: `tlsMode must be one of Disabled, SkipVerification, VerifyCA, VerifyAll`,
		},
		"an unknown tlsMode in stringData is rejected too": {
			stringData: map[string]string{"user": "app", "tlsMode": "verify-full"},
			wantErr:    `tlsMode must be one of`,
		},
		"a caCert that is not PEM is rejected": {
			data:    map[string]string{"user": "app", "tlsMode": "VerifyCA", "caCert": "MIIBszCCAVmgAwIBAgIUQ"},
			wantErr: "caCert must hold PEM certificates",
		},
		"VerifyCA without caCert is rejected": {
			data:    map[string]string{"user": "app", "tlsMode": "VerifyCA"},
			wantErr: "tlsMode VerifyCA and VerifyAll check the server certificate against caCert: set caCert",
		},
		"VerifyAll without caCert is rejected": {
			data:    map[string]string{"user": "app", "password": "pw", "tlsMode": "VerifyAll"},
			wantErr: "tlsMode VerifyCA and VerifyAll check the server certificate against caCert",
		},
		"VerifyAll with an empty caCert is rejected": {
			stringData: map[string]string{"user": "app", "tlsMode": "VerifyAll", "caCert": ""},
			wantErr:    "tlsMode VerifyCA and VerifyAll check the server certificate against caCert",
		},
		"VerifyCA with a caCert is accepted": {
			data: map[string]string{"user": "app", "tlsMode": "VerifyCA", "caCert": pemCert},
		},
		"SkipVerification without caCert is accepted": {
			data: map[string]string{"user": "app", "tlsMode": "SkipVerification"},
		},
		"a clientCert that is not PEM is rejected": {
			data:    map[string]string{"user": "app", "clientCert": "not pem", "clientKey": pemKey},
			wantErr: "clientCert must hold a PEM certificate",
		},
		"a clientKey that is a certificate is rejected": {
			data:    map[string]string{"user": "app", "clientCert": pemCert, "clientKey": pemCert},
			wantErr: "clientKey must hold a PEM private key",
		},
		"a clientCert without clientKey is rejected": {
			data:    map[string]string{"user": "app", "clientCert": pemCert},
			wantErr: "clientCert and clientKey must be set together",
		},
		"a complete Secret is accepted": {
			data: map[string]string{
				"user": "app", "password": "pw", "tlsMode": "VerifyAll",
				"caCert": pemCert, "clientCert": pemCert, "clientKey": pemKey,
			},
		},
		"a tlsMode in the wrong case is rejected": {
			data:    map[string]string{"user": "app", "tlsMode": "verifyCA"},
			wantErr: `tlsMode must be one of`,
		},
		"a clientKey of an unknown kind is rejected": {
			data:    map[string]string{"user": "app", "clientCert": pemCert, "clientKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n"},
			wantErr: "clientKey must hold a PEM private key",
		},
		"an RSA key and an encrypted key are accepted": {
			data: map[string]string{"user": "app", "clientCert": pemCert, "clientKey": "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n"},
		},
		"an encrypted PKCS#8 key is accepted": {
			data: map[string]string{"user": "app", "clientCert": pemCert, "clientKey": "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIF\n-----END ENCRYPTED PRIVATE KEY-----\n"},
		},
		"a Secret with a PKCS#8 key and no password is accepted": {
			data: map[string]string{"user": "app", "tlsMode": "VerifyCA", "caCert": pemCert, "clientCert": pemCert, "clientKey": pemKey8},
		},
		"a minimal Secret is accepted": {
			stringData: map[string]string{"user": "app"},
		},
		"a Secret of another type is not the policy's business": {
			typ:  corev1.SecretTypeOpaque,
			data: map[string]string{"tlsMode": "whatever"},
		},
	}
	i := 0
	for name, tc := range cases {
		i++
		t.Run(name, func(t *testing.T) {
			s := credentialSecret(ns, fmt.Sprintf("pg-%d", i), tc.data)
			s.StringData = tc.stringData
			if tc.typ != "" {
				s.Type = tc.typ
			}
			err := env.Client.Create(t.Context(), s)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}

	// MySQL credential Secrets have the same keys and are held to the same rules, with messages
	// that name their type.
	mySQLCases := map[string]struct {
		data    map[string]string
		wantErr string
	}{
		"a MySQL Secret without user is rejected": {
			data:    map[string]string{"password": "pw"},
			wantErr: `a network.deckhouse.io/mysql-credentials Secret needs a non-empty key "user"`,
		},
		"a MySQL Secret with an unknown tlsMode is rejected": {
			data:    map[string]string{"user": "app", "tlsMode": "REQUIRED"},
			wantErr: `tlsMode must be one of Disabled, SkipVerification, VerifyCA, VerifyAll`,
		},
		"a MySQL Secret with VerifyAll and no caCert is rejected": {
			data:    map[string]string{"user": "app", "tlsMode": "VerifyAll"},
			wantErr: "set caCert to the PEM of the CA that signed the MySQL server certificate",
		},
		"a MySQL Secret with a clientCert and no clientKey is rejected": {
			data:    map[string]string{"user": "app", "tlsMode": "SkipVerification", "clientCert": pemCert},
			wantErr: "clientCert and clientKey must be set together",
		},
		"a complete MySQL Secret is accepted": {
			data: map[string]string{"user": "app", "password": "pw", "tlsMode": "VerifyAll", "caCert": pemCert, "clientCert": pemCert, "clientKey": pemKey},
		},
	}
	for name, tc := range mySQLCases {
		i++
		t.Run(name, func(t *testing.T) {
			s := credentialSecret(ns, fmt.Sprintf("my-%d", i), tc.data)
			s.Type = wellknown.SecretTypeMySQLCredentials
			err := env.Client.Create(t.Context(), s)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
	// The PostgreSQL message names PostgreSQL.
	err := env.Client.Create(ctx, credentialSecret(ns, "pg-verifyall", map[string]string{"user": "app", "tlsMode": "VerifyAll"}), client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the CA that signed the PostgreSQL server certificate")

	// Updates are checked too: breaking an accepted Secret is rejected.
	good := credentialSecret(ns, "pg-updated", map[string]string{"user": "app"})
	require.NoError(t, env.Client.Create(ctx, good))
	good.Data["tlsMode"] = []byte("prefer")
	err = env.Client.Update(ctx, good)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `tlsMode must be one of`)

	// Turning on verification without a CA is refused on update, and with one it is accepted.
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(good), good))
	good.Data["tlsMode"] = []byte("VerifyAll")
	err = env.Client.Update(ctx, good)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tlsMode VerifyCA and VerifyAll check the server certificate against caCert")
	good.Data["caCert"] = []byte(pemCert)
	require.NoError(t, env.Client.Update(ctx, good))
}
