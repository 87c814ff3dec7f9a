// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package credentials keeps the PostgreSQL and MySQL credential Secrets that probes reference, read under
// least privilege: one watch per referenced Secret, narrowed by the field selector
// metadata.name=<name> (which RBAC authorizes against resourceNames), started and stopped as
// references change. It never lists the Secrets of a namespace or of the cluster.
package credentials

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/api/wellknown"
)

// TLSMode says how a probe protects and verifies its PostgreSQL or MySQL connection.
type TLSMode string

// The TLS modes of a credential Secret (key tlsMode).
const (
	// TLSDisabled connects without TLS.
	TLSDisabled TLSMode = "Disabled"
	// TLSSkipVerification uses TLS but accepts any server certificate.
	TLSSkipVerification TLSMode = "SkipVerification"
	// TLSVerifyCA verifies that the server certificate chains to caCert. It does not prove which
	// server answers, so passwords are still only used with SCRAM.
	TLSVerifyCA TLSMode = "VerifyCA"
	// TLSVerifyAll also verifies that the certificate names the pod IP (an IP SAN).
	TLSVerifyAll TLSMode = "VerifyAll"
)

// The keys of a credential Secret.
const (
	KeyUser       = "user"
	KeyPassword   = "password"
	KeyTLSMode    = "tlsMode"
	KeyCACert     = "caCert"
	KeyClientCert = "clientCert"
	KeyClientKey  = "clientKey"
)

// Credentials are the parsed contents of one credential Secret. They are immutable once built;
// the store replaces them when the Secret changes. Printing them never shows the password or the
// client key.
type Credentials struct {
	// Type is the Secret's type (wellknown.SecretTypePostgreSQLCredentials or
	// wellknown.SecretTypeMySQLCredentials): a probe uses only a Secret of its own kind.
	Type string
	// User is the role to log in as.
	User string
	// TLSMode is how the connection is protected.
	TLSMode TLSMode
	// RootCAs holds caCert, for VerifyCA and VerifyAll; nil otherwise.
	RootCAs *x509.CertPool
	// ClientCertificate is clientCert with clientKey, when both are set.
	ClientCertificate *tls.Certificate

	password string
}

// Password returns the password (may be empty, e.g. for certificate authentication).
func (c *Credentials) Password() string {
	return c.password
}

// VerifiesCertificate reports whether the TLS mode verifies the server's certificate chain
// against caCert (VerifyCA and VerifyAll), which is why those modes need caCert.
func (c *Credentials) VerifiesCertificate() bool {
	return c.TLSMode == TLSVerifyCA || c.TLSMode == TLSVerifyAll
}

// VerifiesServer reports whether the TLS mode proves which server answers: only VerifyAll,
// whose certificate must name the pod IP. That is what allows sending a password the server
// could read (clear text) or replay (MD5). VerifyCA does not: any server holding a
// certificate from the same CA would pass it and could harvest the password.
func (c *Credentials) VerifiesServer() bool {
	return c.TLSMode == TLSVerifyAll
}

// String describes the credentials without secrets.
func (c *Credentials) String() string {
	return fmt.Sprintf("Credentials{User: %q, TLSMode: %s, Password: %s, ClientCertificate: %t}",
		c.User, c.TLSMode, redacted(c.password), c.ClientCertificate != nil)
}

// GoString is String, so %#v does not print the password either.
func (c *Credentials) GoString() string {
	return c.String()
}

func redacted(s string) string {
	if s == "" {
		return "<empty>"
	}
	return "<redacted>"
}

// Parse checks a credential Secret and builds its Credentials. The error says what is wrong
// without quoting any value.
func Parse(secret *corev1.Secret) (*Credentials, error) {
	if !wellknown.IsCredentialSecretType(string(secret.Type)) {
		return nil, fmt.Errorf("wrong type %q, want %s or %s", secret.Type,
			wellknown.SecretTypePostgreSQLCredentials, wellknown.SecretTypeMySQLCredentials)
	}
	c := &Credentials{Type: string(secret.Type), TLSMode: TLSDisabled}
	user, ok := secret.Data[KeyUser]
	if !ok || len(user) == 0 {
		return nil, fmt.Errorf("key %s missing", KeyUser)
	}
	c.User = string(user)
	c.password = string(secret.Data[KeyPassword])
	if m, ok := secret.Data[KeyTLSMode]; ok {
		c.TLSMode = TLSMode(strings.TrimSpace(string(m)))
		switch c.TLSMode {
		case TLSDisabled, TLSSkipVerification, TLSVerifyCA, TLSVerifyAll:
		default:
			return nil, fmt.Errorf("key %s: %q is not one of Disabled, SkipVerification, VerifyCA, VerifyAll", KeyTLSMode, c.TLSMode)
		}
	}
	if ca, ok := secret.Data[KeyCACert]; ok && len(ca) > 0 {
		pool, err := parseCAs(ca)
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", KeyCACert, err)
		}
		c.RootCAs = pool
	}
	if c.VerifiesCertificate() && c.RootCAs == nil {
		return nil, fmt.Errorf("key %s missing (required for tlsMode %s)", KeyCACert, c.TLSMode)
	}
	cert, hasCert := secret.Data[KeyClientCert]
	key, hasKey := secret.Data[KeyClientKey]
	switch {
	case hasCert != hasKey:
		return nil, fmt.Errorf("keys %s and %s must be set together", KeyClientCert, KeyClientKey)
	case hasCert:
		if c.TLSMode == TLSDisabled {
			return nil, fmt.Errorf("key %s needs TLS, but tlsMode is Disabled", KeyClientCert)
		}
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			// The error of X509KeyPair never contains key material.
			return nil, fmt.Errorf("keys %s and %s: %w", KeyClientCert, KeyClientKey, err)
		}
		c.ClientCertificate = &pair
	}
	return c, nil
}

func parseCAs(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing certificate: %w", err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("no PEM certificate found")
	}
	return pool, nil
}
