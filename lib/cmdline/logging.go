// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package cmdline

import (
	"errors"
	"io"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// LogLevel is the value of --log-level.
type LogLevel string

// The log levels. logr has no warning level: at warn, what the programs and controller-runtime
// log through logr shows only its errors (zap's own warnings are kept).
const (
	LogDebug LogLevel = "debug"
	LogInfo  LogLevel = "info"
	LogWarn  LogLevel = "warn"
	LogError LogLevel = "error"
)

// DebugVerbosity is the highest logr V-level shown at debug: the programs log their decisions
// at V(1) and every probe at V(4).
const DebugVerbosity = 5

var _ pflag.Value = (*LogLevel)(nil)

// Set takes one of the levels; anything else is an error that pflag reports with the flag.
func (l *LogLevel) Set(s string) error {
	switch LogLevel(s) {
	case LogDebug, LogInfo, LogWarn, LogError:
		*l = LogLevel(s)
		return nil
	default:
		return errors.New("must be debug, info, warn or error")
	}
}

// String is the level as the flag takes it.
func (l *LogLevel) String() string { return string(*l) }

// Type names the value in --help.
func (l *LogLevel) Type() string { return "level" }

// zapLevel is the lowest zap level logged; logr's V(n) is zap level -n.
func (l LogLevel) zapLevel() zapcore.Level {
	switch l {
	case LogDebug:
		return zapcore.Level(-DebugVerbosity)
	case LogWarn:
		return zapcore.WarnLevel
	case LogError:
		return zapcore.ErrorLevel
	default:
		return zapcore.InfoLevel
	}
}

// NewLogger returns the logger of level l: zap JSON lines written to w.
func NewLogger(l LogLevel, w io.Writer) logr.Logger {
	return zap.New(zap.Level(l.zapLevel()), zap.WriteTo(w))
}

// SetupLogger builds the logger of the --log-level (JSON lines on w, the program's stderr) and
// makes it controller-runtime's and klog's, so client-go's messages (leader election, throttling,
// warnings from the API server) come out in the same form.
func (c *Common) SetupLogger(w io.Writer) logr.Logger {
	log := NewLogger(c.LogLevel, w)
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	return log
}
