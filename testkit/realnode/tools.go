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
	PauseImage  = "swh.test/pause:1"
	ServerImage = "swh.test/podserver:1"
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

// BuildImages builds the pause program and the pod server as static binaries and packs each
// into an OCI archive in dir (PauseImage, ServerImage); it returns the archives' paths.
func BuildImages(dir string) ([]string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	var archives []string
	for _, img := range []Image{
		{Ref: PauseImage, Name: "swh-pause"},
		{Ref: ServerImage, Name: "swh-podserver"},
	} {
		img.Binary = filepath.Join(dir, img.Name)
		// Static, whatever the caller's build (a -race test binary builds with cgo).
		cmd := exec.Command("go", "build", "-trimpath", "-o", img.Binary, "./cmd/"+img.Name)
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
