// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package prober

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
)

// tlsConfig builds the client TLS setup of a probe that speaks TLS to the pod (HTTPS; any later
// kind with the same fields: host, caCert, insecureSkipTLSVerify). The server name is hostOnly(host)
// when host is set, else the pod's IP. An IP literal (the pod's, or a host that is one) is
// sent as no server name at all (crypto/tls leaves SNI out for one, as RFC 6066 asks) and
// checked against the certificate's IP SANs; it is given without brackets. A caCert replaces
// the system roots; insecure skips verification. The error names the field: "caCert: ...".
func tlsConfig(host string, pod netip.Addr, caCert string, insecure bool) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure} //nolint:gosec // Opt-in per probe.
	if host != "" {
		cfg.ServerName = hostOnly(host)
	} else {
		cfg.ServerName = pod.String()
	}
	if caCert != "" {
		pool, err := caPool(caCert)
		if err != nil {
			return nil, fmt.Errorf("caCert: %w", err)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// caPools caches parsed caCert PEMs: probes repeat every period with the same PEM.
var caPools = struct {
	sync.Mutex
	m map[string]*x509.CertPool
}{m: map[string]*x509.CertPool{}}

const maxCachedCAs = 256

func caPool(pemData string) (*x509.CertPool, error) {
	caPools.Lock()
	defer caPools.Unlock()
	if pool, ok := caPools.m[pemData]; ok {
		return pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(pemData)) {
		return nil, errors.New("no PEM certificate found")
	}
	if len(caPools.m) >= maxCachedCAs {
		clear(caPools.m)
	}
	caPools.m[pemData] = pool
	return pool, nil
}

// certificateReason names a server certificate that failed verification, for the HTTPS and
// PostgreSQL probers alike.
func certificateReason(err error) (string, bool) {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &unknownAuthority):
		return "TLS: certificate signed by unknown authority", true
	case errors.As(err, &hostname):
		return "TLS: certificate is not valid for " + hostname.Host, true
	case errors.As(err, &invalid):
		return "TLS: " + invalid.Error(), true
	}
	return "", false
}

// tlsReason turns a handshake error into "TLS: ...".
func tlsReason(ctx context.Context, err error, timeout time.Duration) string {
	if reason, ok := limitReason(err); ok {
		return reason
	}
	if reason, ok := certificateReason(err); ok {
		return reason
	}
	var recordHeader tls.RecordHeaderError
	switch {
	case errors.As(err, &recordHeader) && strings.HasPrefix(recordHeader.Msg, "oversized record"):
		// crypto/tls's own bound on a record: 16 KiB of payload plus 2 KiB (256 bytes in TLS 1.3).
		return "TLS: " + recordHeader.Msg + " (over crypto/tls's record limit)"
	case errors.As(err, &recordHeader):
		return "TLS: server did not answer with TLS"
	case isTimeout(err), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "TLS handshake: " + netReason(ctx, err, timeout)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return "TLS handshake: " + netReason(ctx, err, timeout)
	}
	return "TLS: " + strings.TrimPrefix(err.Error(), "tls: ")
}

// credentialsTLSConfig builds the TLS setup of a credential Secret's tlsMode (PostgreSQL and
// MySQL probes share it), with its client certificate; nil for Disabled. VerifyAll checks the
// certificate against the pod's IP.
func credentialsTLSConfig(c *credentials.Credentials, pod netip.Addr) *tls.Config {
	var cfg *tls.Config
	switch c.TLSMode {
	case credentials.TLSSkipVerification:
		cfg = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // The Secret asks for it.
	case credentials.TLSVerifyCA:
		// Verify the chain, not the name (libpq's verify-ca).
		cfg = &tls.Config{
			InsecureSkipVerify: true, //nolint:gosec // Verified by verifyChain.
			VerifyConnection:   verifyChain(c.RootCAs),
		}
	case credentials.TLSVerifyAll:
		// The certificate must chain to caCert and name the pod IP (an IP SAN): the probe dials
		// the IP, so the IP is the identity it can check.
		cfg = &tls.Config{RootCAs: c.RootCAs, ServerName: pod.String()}
	default:
		return nil
	}
	cfg.MinVersion = tls.VersionTLS12
	if c.ClientCertificate != nil {
		cfg.Certificates = []tls.Certificate{*c.ClientCertificate}
	}
	return cfg
}

// verifyChain checks that the server's certificate chains to roots, whatever names it holds.
func verifyChain(roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("server sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
		return err
	}
}
