// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

// Package programs checks the chart against the programs it runs: every flag the templates
// render is one the program has, with a value it accepts.
package programs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/deckhouse/service-with-healthchecks/tests/internal/bundle"
)

type program struct {
	dir, pkg  string
	container string
	spec      func(objs bundle.Objects) (*corev1.PodSpec, error)
}

var programs = map[string]program{
	"controller": {dir: "images/controller", pkg: "./cmd/controller", container: "controller", spec: func(o bundle.Objects) (*corev1.PodSpec, error) {
		d, err := o.Deployment(bundle.Namespace, "controller")
		if err != nil {
			return nil, err
		}
		return &d.Spec.Template.Spec, nil
	}},
	"agent": {dir: "images/agent", pkg: "./cmd/agent", container: "agent", spec: func(o bundle.Objects) (*corev1.PodSpec, error) {
		d, err := o.DaemonSet(bundle.Namespace, "agent")
		if err != nil {
			return nil, err
		}
		return &d.Spec.Template.Spec, nil
	}},
}

func build(t *testing.T, p program) string {
	t.Helper()
	root, err := bundle.Root()
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), filepath.Base(p.pkg))
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, p.pkg)
	cmd.Dir = filepath.Join(root, p.dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "building %s: %s", p.pkg, out)
	return bin
}

// startup runs the program with args and a kubeconfig that does not exist, and returns what it
// printed. The program must get past flag parsing and stop at the kubeconfig.
func startup(t *testing.T, bin string, args []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig="+missing)...)
	cmd.Env = append(os.Environ(), "NODE_NAME=node-1", "KUBECONFIG=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	require.Error(t, err, "the program must not run without a cluster: %s", out.String())
	require.NoError(t, ctx.Err(), "the program must exit on a missing kubeconfig: %s", out.String())
	return out.String()
}

// renderedArgs are the program's args as the kubelet passes them ($(NODE_NAME) expanded).
func renderedArgs(t *testing.T, p program, set bundle.ValueSet) []string {
	t.Helper()
	values, err := set.Values()
	require.NoError(t, err)
	objs, err := bundle.Render(values)
	require.NoError(t, err)
	spec, err := p.spec(objs)
	require.NoError(t, err)
	c := bundle.Container(spec, p.container)
	require.NotNil(t, c)
	args := make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		args = append(args, strings.ReplaceAll(a, "$(NODE_NAME)", "node-1"))
	}
	return args
}

func TestProgramsAcceptEveryRenderedFlag(t *testing.T) {
	for name, p := range programs {
		t.Run(name, func(t *testing.T) {
			bin := build(t, p)

			// The check can fail: a value the program does not take is reported by name.
			out := startup(t, bin, []string{"--log-level=verbose"})
			assert.Contains(t, out, "--log-level", "a bad flag is reported by name")
			t.Run("a bad flag exits 2 with one line", func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				cmd := exec.CommandContext(t.Context(), bin, "--log-level=verbose")
				cmd.Env = append(os.Environ(), "NODE_NAME=node-1", "KUBECONFIG=")
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				exitErr, ok := errors.AsType[*exec.ExitError](cmd.Run())
				require.True(t, ok, "the program fails: %s", stderr.String())
				assert.Equal(t, 2, exitErr.ExitCode(), "a usage error")
				assert.Equal(t, name+`: invalid argument "verbose" for "--log-level" flag: must be debug, info, warn or error (see --help)`+"\n",
					stderr.String(), "one line naming the program, the flag and the reason")
				assert.Empty(t, stdout.String())
			})

			for setName, set := range bundle.ValueSets() {
				t.Run(setName, func(t *testing.T) {
					args := renderedArgs(t, p, set)
					out := startup(t, bin, args)
					for _, a := range args {
						flagName, _, _ := strings.Cut(a, "=")
						assert.NotContains(t, out, flagName+" ", "the program rejected %s: %s", a, out)
						assert.NotContains(t, out, "(see --help)", "a usage error in %v: %s", args, out)
					}
				})
			}
		})
	}
}
