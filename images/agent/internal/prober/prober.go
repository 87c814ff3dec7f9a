// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package prober runs one probe (TCP with an optional send/expect dialogue, HTTP(S), PostgreSQL,
// MySQL or gRPC) against one pod address and says whether it passed. It follows the kubelet's
// prober: a probe returns Success or Failure with a short human reason; a Go error means the
// probe could not be run at all (invalid input), never that the target is down. Every probe has
// a hard deadline of timeoutSeconds, applied inside,
// reads at most a constant number of bytes from the pod whatever the deadline (limits.go),
// dials only podIP:port, reuses no connection and leaves no goroutine behind.
package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/deckhouse/service-with-healthchecks/api/v1alpha1"
	"github.com/deckhouse/service-with-healthchecks/images/agent/internal/credentials"
)

// Outcome is the verdict of one probe.
type Outcome int

// The outcomes.
const (
	// Failure means the target did not pass; Result.Reason says why.
	Failure Outcome = iota
	// Success means the target passed.
	Success
	// Deferred means the probe was not run: an input it needs is still loading (a credential
	// Secret whose watch has not synced yet). The run counts for nothing, neither pass nor fail.
	Deferred
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "Success"
	case Deferred:
		return "Deferred"
	}
	return "Failure"
}

// Result is the outcome of one probe with a short human reason, e.g. "connection refused",
// "HTTP 503", "query returned false".
type Result struct {
	Outcome Outcome
	Reason  string
}

func success(reason string) Result { return Result{Outcome: Success, Reason: reason} }
func failure(reason string) Result { return Result{Outcome: Failure, Reason: reason} }

// CredentialSource returns the parsed credential Secret namespace/name. Its errors name the
// Secret and the problem (see credentials.Error) and become the probe's failure reason.
type CredentialSource interface {
	Lookup(namespace, name string) (*credentials.Credentials, error)
}

// Options configure a Prober.
type Options struct {
	// Credentials serves the Secrets of PostgreSQL and MySQL probes (authSecretName). Nil fails
	// every such probe that names a Secret.
	Credentials CredentialSource
	// Logger receives debug output (V(4)); default discards. Passwords are never logged.
	Logger logr.Logger
}

// Prober runs probes. It is safe for concurrent use.
type Prober struct {
	creds   CredentialSource
	log     logr.Logger
	regexps regexpCache // of tcp.steps' expect.regex
}

// New returns a Prober.
func New(opts Options) *Prober {
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	return &Prober{creds: opts.Credentials, log: opts.Logger}
}

// Probe runs probe against podIP:port (port is already resolved from the pod) of a pod in
// namespace, within probe.TimeoutSeconds (or the earlier deadline of ctx). A pod that answers
// more than a bound allows fails with a reason that names the bound.
func (p *Prober) Probe(ctx context.Context, probe v1alpha1.Probe, namespace, podIP string, port int32) (Result, error) {
	ip, err := netip.ParseAddr(podIP)
	if err != nil {
		return Result{}, fmt.Errorf("pod IP %q: %w", podIP, err)
	}
	if port < 1 || port > 65535 {
		return Result{}, fmt.Errorf("port %d out of range", port)
	}
	timeout := time.Duration(probe.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Duration(v1alpha1.DefaultTimeoutSeconds) * time.Second
	}
	addr := netip.AddrPortFrom(ip.Unmap(), uint16(port))

	var res Result
	switch probe.Mode {
	case v1alpha1.ProbeModeTCP:
		if probe.TCP == nil {
			return Result{}, errors.New("mode TCP without a tcp block")
		}
		if len(probe.TCP.Steps) > 0 {
			res, err = p.probeTCPDialogue(ctx, probe.TCP, addr, timeout)
			break
		}
		// The TCP probe applies the deadline itself, without a context of its own (tcp.go).
		res = p.probeTCP(ctx, addr, timeout)
	case v1alpha1.ProbeModeHTTP:
		if probe.HTTP == nil {
			return Result{}, errors.New("mode HTTP without an http block")
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		res, err = p.probeHTTP(ctx, probe.HTTP, addr, timeout)
		cancel()
	case v1alpha1.ProbeModePostgreSQL:
		if probe.PostgreSQL == nil {
			return Result{}, errors.New("mode PostgreSQL without a postgreSQL block")
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		res, err = p.probePostgreSQL(ctx, probe.PostgreSQL, namespace, addr, timeout)
		cancel()
	case v1alpha1.ProbeModeMySQL:
		if probe.MySQL == nil {
			return Result{}, errors.New("mode MySQL without a mySQL block")
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		res, err = p.probeMySQL(ctx, probe.MySQL, namespace, addr, timeout)
		cancel()
	case v1alpha1.ProbeModeGRPC:
		if probe.GRPC == nil {
			return Result{}, errors.New("mode GRPC without a grpc block")
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		res, err = p.probeGRPC(ctx, probe.GRPC, addr, timeout)
		cancel()
	default:
		return Result{}, fmt.Errorf("unknown probe mode %q", probe.Mode)
	}
	if err != nil {
		return Result{}, err
	}
	// Reasons become Events and status text; parts of some come from the pod.
	res.Reason = fitReason(res.Reason)
	if p.log.V(4).Enabled() {
		p.log.V(4).Info("probed", "mode", probe.Mode, "address", addr.String(), "outcome", res.Outcome.String(), "reason", res.Reason)
	}
	return res, nil
}

// fitReason is serverText(reason, maxReasonBytes) without its copy for the usual reason, which
// is short printable ASCII ("connected", "HTTP 200"): one allocation less per probe.
func fitReason(reason string) string {
	if len(reason) <= maxReasonBytes {
		plain := true
		for i := 0; i < len(reason) && plain; i++ {
			plain = reason[i] >= ' ' && reason[i] < 0x7f
		}
		if plain {
			return reason
		}
	}
	return serverText(reason, maxReasonBytes)
}

// resetOnClose is SO_LINGER 0: close sends RST instead of FIN, so the probing side keeps no
// TIME-WAIT socket (thousands of probes would exhaust the ports). A variable, so that setting
// it allocates nothing.
var resetOnClose = syscall.Linger{Onoff: 1, Linger: 0}

// probeDialer sets SO_LINGER 0 on the socket before it connects: closing sends RST instead of
// FIN, so the probing side keeps no TIME-WAIT socket (thousands of probes would exhaust ports).
// Keep-alive is off: a probe's connection lives for milliseconds, and the four socket options
// Go sets for it by default were a tenth of the CPU time of a TCP probe (development/BENCHMARKS.md).
var probeDialer = net.Dialer{
	KeepAlive: -1,
	Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptLinger(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER, &resetOnClose)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("setting SO_LINGER: %w", serr)
		}
		return nil
	},
}

// dial connects to addr (see probeDialer).
func dial(ctx context.Context, addr netip.AddrPort) (*net.TCPConn, error) {
	c, err := probeDialer.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// netReason turns a network error into a short reason.
func netReason(ctx context.Context, err error, timeout time.Duration) string {
	var errno syscall.Errno
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || isTimeout(err):
		if ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return "probe cancelled"
		}
		return "timeout after " + timeout.String()
	case errors.Is(err, context.Canceled):
		return "probe cancelled"
	case errors.As(err, &errno):
		switch errno {
		case syscall.ECONNREFUSED:
			return "connection refused"
		case syscall.ECONNRESET:
			return "connection reset by peer"
		case syscall.EHOSTUNREACH:
			return "no route to host"
		case syscall.ENETUNREACH:
			return "network unreachable"
		case syscall.EPIPE:
			return "connection closed by peer"
		}
		return errno.Error()
	case errors.Is(err, net.ErrClosed):
		return "connection closed"
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
