// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/deckhouse/service-with-healthchecks/testkit/controlplane"
)

// Image references of the local images.
const (
	// PauseImage is the pod sandbox (testkit/cmd/swh-pause).
	PauseImage = "swh.test/pause:1"
	// ServerImage is the HTTP pod server (testkit/cmd/swh-podserver).
	ServerImage = "swh.test/podserver:1"
	// TestServerImage is the multi-mode server (testkit/cmd/swh-testserver): HTTP, SMTP-like
	// (banner; wedged), the hostile ones (silent, endless headers, huge body) and the gRPC health
	// server, one MODE=ADDR argument per listener.
	TestServerImage = "swh.test/testserver:1"
)

// ToolDir builds a tool group of tools/build.sh when it is not in the cache yet (node: the
// kubelet; containerd: containerd, ctr, the shim and the CNI plugins) and returns its folder.
func ToolDir(group string) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "tools", "build.sh")
	if out, err := exec.Command(script, group).CombinedOutput(); err != nil {
		return "", fmt.Errorf("tools/build.sh %s: %w: %s", group, err, out)
	}
	out, err := exec.Command(script, "--dir", group).Output()
	if err != nil {
		return "", fmt.Errorf("tools/build.sh --dir %s: %w", group, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// BuildImages builds the pause program, the pod server and the multi-mode test server as static
// binaries and packs each into an OCI archive in dir (PauseImage, ServerImage,
// TestServerImage); it returns the archives' paths. The archives are reproducible: the same
// source gives the same bytes (-trimpath, no VCS stamp, WriteArchive's fixed metadata), whatever
// the checkout's commit or state.
func BuildImages(dir string) ([]string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	var archives []string
	for _, img := range []Image{
		{Ref: PauseImage, Name: "swh-pause"},
		{Ref: ServerImage, Name: "swh-podserver"},
		{Ref: TestServerImage, Name: "swh-testserver"},
	} {
		img.Binary = filepath.Join(dir, img.Name)
		// Static, whatever the caller's build (a -race test binary builds with cgo); no VCS
		// stamp, so a commit or a dirty tree does not change the bytes of the same source.
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", img.Binary, "./cmd/"+img.Name)
		cmd.Dir = filepath.Join(root, "testkit")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %w: %s", img.Name, err, out)
		}
		archive := filepath.Join(dir, img.Name+".oci.tar")
		if err := WriteArchive(img, archive); err != nil {
			return nil, err
		}
		archives = append(archives, archive)
	}
	return archives, nil
}
