// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package process

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// builds remembers each program Build has built in this process, by "module pkg".
var builds = struct {
	sync.Mutex
	done map[string]*build
}{done: map[string]*build{}}

type build struct {
	once sync.Once
	path string
	err  error
}

// Build builds a program of the repository once per process and returns the path of the
// binary: pkg (e.g. "./cmd/controller") of module (e.g. "images/controller", relative to the
// repository root), with `go build` in the repository's workspace.
//
// The binary is built into one cache folder (~/.cache/service-with-healthchecks/test-bin/,
// outside the checkout) under a file lock, so parallel test binaries do not race and `go build
// -o` skips linking when the binary there is up to date; then it is copied into a temporary
// folder of this process, which a later rebuild cannot change while the program runs. Inside an
// isolated test binary that folder is on the binary's private tmpfs and vanishes with it.
//
// A test binary built with -race (make test-race) builds the programs with -race as well, so
// the race detector watches the programs the tests start too; their binaries have names of
// their own (a "-race" suffix), so a race run never replaces the binaries `make test` reuses.
func Build(module, pkg string) (string, error) {
	key := module + " " + pkg
	builds.Lock()
	b, ok := builds.done[key]
	if !ok {
		b = &build{}
		builds.done[key] = b
	}
	builds.Unlock()
	b.once.Do(func() { b.path, b.err = buildOnce(module, pkg) })
	return b.path, b.err
}

func buildOnce(module, pkg string) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding the cache folder: %w", err)
	}
	cacheDir := filepath.Join(cache, "service-with-healthchecks", "test-bin")
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", cacheDir, err)
	}
	lock, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("opening the build lock: %w", err)
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", cacheDir, err)
	}
	// One cached binary per module and package: images/controller ./cmd/controller is
	// images-controller-cmd-controller.
	name := strings.NewReplacer("/", "-", ".", "").Replace(strings.Trim(module+"/"+pkg, "/"))
	args := []string{"build"}
	if raceBuild {
		name += "-race"
		args = append(args, "-race")
	}
	cached := filepath.Join(cacheDir, name)
	cmd := exec.Command("go", append(args, "-o", cached, pkg)...)
	cmd.Dir = filepath.Join(root, module)
	if raceBuild {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // -race needs cgo
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s/%s: %w: %s", module, pkg, err, out)
	}
	dir, err := os.MkdirTemp("", "swh-bin-")
	if err != nil {
		return "", fmt.Errorf("creating the binaries' folder: %w", err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	if err := copyFile(cached, out); err != nil {
		return "", err
	}
	return out, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("copying %s: %w", from, err)
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return fmt.Errorf("copying %s: %w", from, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copying %s to %s: %w", from, to, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copying %s to %s: %w", from, to, err)
	}
	return nil
}
