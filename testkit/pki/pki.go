// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package pki makes throw-away certificate authorities and certificates for tests: a CA, server
// certificates with or without IP addresses in their SAN, and client certificates. Keys are
// ECDSA P-256 so generating them is fast.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"sync/atomic"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority that signs test certificates.
type CA struct {
	// CertPEM is the CA certificate, PEM encoded.
	CertPEM []byte
	// Pool holds the CA certificate, for tls.Config.RootCAs or ClientCAs.
	Pool *x509.CertPool

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Pair is a certificate and its private key.
type Pair struct {
	// CertPEM is the certificate, PEM encoded.
	CertPEM []byte
	// KeyPEM is the private key (PKCS#8), PEM encoded.
	KeyPEM []byte
}

// TLSCertificate returns the pair for tls.Config.Certificates.
func (p Pair) TLSCertificate() (tls.Certificate, error) {
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("loading key pair: %w", err)
	}
	return c, nil
}

// NewCA creates a self-signed CA whose subject is commonName.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Pool:    pool,
		cert:    cert,
		key:     key,
	}, nil
}

// Server issues a server certificate for the DNS names and IP addresses given. Leave ips empty
// for a certificate that does not name any address.
func (ca *CA) Server(commonName string, dnsNames []string, ips []net.IP) (Pair, error) {
	return ca.issue(commonName, dnsNames, ips, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate whose common name is user (PostgreSQL's cert
// authentication maps the common name to the role).
func (ca *CA) Client(user string) (Pair, error) {
	return ca.issue(user, nil, nil, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) issue(cn string, dnsNames []string, ips []net.IP, usage x509.ExtKeyUsage) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generating key for %s: %w", cn, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, fmt.Errorf("creating certificate for %s: %w", cn, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, fmt.Errorf("encoding key for %s: %w", cn, err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}
