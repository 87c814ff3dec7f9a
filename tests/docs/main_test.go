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
