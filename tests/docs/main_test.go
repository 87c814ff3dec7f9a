// Package docs tests the user documentation in docs/ against the real API: every resource
// example is accepted by a real kube-apiserver, the resource reference (CR.md) and the CRD list
// the same fields, the doc-ru CRD has the CRD's structure, and every page has its Russian twin.
package docs

import (
	"fmt"
	"os"
	"testing"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

var env *controlplane.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	env, err = controlplane.Start(controlplane.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	return m.Run()
}
