// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package cmdline is the one command-line stack of the module's programs (the agent and the
// controller): pflag flag sets with a --help that lists every flag and its default, the flags
// both programs share (--kubeconfig, --kube-api-qps, --kube-api-burst, --metrics-bind-address,
// --health-probe-bind-address, --log-level) with their checks, the logger and the API server
// configuration those flags describe, and the exit codes:
//
//   - 0: the program ran and stopped cleanly, or --help or --version was printed (on stdout);
//   - 2: a usage error (a bad flag, a bad value, a missing required value, a stray argument):
//     one line "<program>: <reason> (see --help)" on stderr;
//   - 1: a failure after the command line was accepted: one line "<program>: <reason>".
package cmdline

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/deckhouse/service-with-healthchecks/lib/version"
)

// Exit codes of the programs.
const (
	// ExitOK is a clean stop, or --help.
	ExitOK = 0
	// ExitFailure is a failure after the command line was accepted.
	ExitFailure = 1
	// ExitUsage is a bad command line.
	ExitUsage = 2
)

// ErrHelp is returned by Program.Parse when --help (or -h) was asked for and the help was
// written; the program then stops with ExitOK.
var ErrHelp = errors.New("help requested")

// ErrVersion is returned by Program.Parse when --version was asked for and the version line
// (version.Line) was written; the program then stops with ExitOK.
var ErrVersion = errors.New("version requested")

// UsageError is a bad command line: the program stops with ExitUsage.
type UsageError struct {
	err error
}

// Error is the reason, on one line.
func (e *UsageError) Error() string { return oneLine(e.err.Error()) }

// Unwrap returns the reason.
func (e *UsageError) Unwrap() error { return e.err }

// Usage marks err as a usage error; nil stays nil, and a usage error is returned as it is.
func Usage(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*UsageError](err); ok {
		return err
	}
	return &UsageError{err: err}
}

// Usagef is a usage error with a formatted reason.
func Usagef(format string, args ...any) error {
	return &UsageError{err: fmt.Errorf(format, args...)}
}

// Program is the command line of one program.
type Program struct {
	// Name is the program's name: it starts every line the program reports on stderr.
	Name string
	// Synopsis is what --help prints between the usage line and the flags.
	Synopsis string
	// Flags are the program's flags; the program adds its own and the shared ones before Parse.
	Flags *pflag.FlagSet

	help        bool
	showVersion bool
}

// New returns the command line of the program name, with --help defined.
func New(name, synopsis string) *Program {
	p := &Program{Name: name, Synopsis: synopsis, Flags: pflag.NewFlagSet(name, pflag.ContinueOnError)}
	// Parse reports errors through its result only: the one line is written by Report.
	p.Flags.SetOutput(io.Discard)
	p.Flags.Usage = func() {}
	p.Flags.BoolVar(&p.help, "help", false, "Print this help (every flag and its default) on stdout and exit.")
	p.Flags.BoolVar(&p.showVersion, "version", false, "Print the version, the git revision and the Go version on stdout and exit.")
	return p
}

// Parse parses args (without the program's name). On --help it writes the help to stdout and
// returns ErrHelp; on --version, the version line and ErrVersion (--help wins over --version).
// Every other problem, a stray argument included, is a *UsageError on one line.
func (p *Program) Parse(args []string, stdout io.Writer) error {
	err := p.Flags.Parse(args)
	if errors.Is(err, pflag.ErrHelp) || (err == nil && p.help) {
		if _, werr := io.WriteString(stdout, p.Help()); werr != nil {
			return fmt.Errorf("writing the help: %w", werr)
		}
		return ErrHelp
	}
	if err != nil {
		return Usage(err)
	}
	if p.showVersion {
		if _, werr := io.WriteString(stdout, version.Line(p.Name)); werr != nil {
			return fmt.Errorf("writing the version: %w", werr)
		}
		return ErrVersion
	}
	if p.Flags.NArg() > 0 {
		return Usagef("unexpected argument %q: %s takes flags only", p.Flags.Arg(0), p.Name)
	}
	return nil
}

// Help is the text --help prints.
func (p *Program) Help() string {
	return fmt.Sprintf("Usage: %s [flags]\n\n%s\n\nFlags:\n%s", p.Name, strings.TrimSpace(p.Synopsis), p.Flags.FlagUsages())
}

// Report writes what ended the program to stderr, in one line, and returns the program's exit
// code: ExitOK for nil, ErrHelp and ErrVersion (nothing is written), ExitUsage for a usage error
// ("<name>: <reason> (see --help)"), ExitFailure for any other error ("<name>: <reason>").
func Report(stderr io.Writer, name string, err error) int {
	switch {
	case err == nil, errors.Is(err, ErrHelp), errors.Is(err, ErrVersion):
		return ExitOK
	case isUsage(err):
		_, _ = fmt.Fprintf(stderr, "%s: %s (see --help)\n", name, oneLine(err.Error()))
		return ExitUsage
	default:
		_, _ = fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err.Error()))
		return ExitFailure
	}
}

func isUsage(err error) bool {
	_, ok := errors.AsType[*UsageError](err)
	return ok
}

// oneLine folds the white space of a message (a kubeconfig or API error may span lines) so that
// the reason is one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
